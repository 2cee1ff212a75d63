"""The last gate's cases, shared by its in-process tests (`planner/test_sql_fidelity.py`) and its tests over Spark
Connect (`spark_jobs/test_connect.py`): the same texts refused (with a word of the refusal) and let through on both
paths."""

from __future__ import annotations

GATE_REFUSED = [
    ("CREATE TABLE pwned AS SELECT * FROM __iox_scan_0", "not as a read-only query"),
    ("INSERT OVERWRITE DIRECTORY '/tmp/iox_gate_pwned' SELECT 1", "not as a read-only query"),
    ("CACHE TABLE pwned AS SELECT 1", "not as a read-only query"),
    ("SET spark.sql.ansi.enabled=false", "not as a read-only query"),
    ("DROP VIEW __iox_scan_0", "not as a read-only query"),
    ("EXECUTE IMMEDIATE 'SELECT 1'", "not as a read-only query"),
    ("DECLARE pwned INT", "not as a read-only query"),
    ("ADD JAR /tmp/evil.jar", "not as a read-only query"),
    ("SELECT reflect('java.lang.System', 'getenv', 'HOME')", "reflect"),
    ("SELECT `java_method`('java.lang.System', 'getenv', 'HOME')", "java_method"),
    ("SELECT system.builtin.abs(1)", "allowed list"),
    ("SELECT input_file_name() FROM __iox_scan_0", "input_file_name"),
    ("SELECT current_user", "current_user"),
    ("SELECT city FROM __iox_scan_0 GROUP BY city HAVING max(session_user) > ''", "session_user"),
    ("SELECT IDENTIFIER('reflect')('a', 'b')", "IDENTIFIER"),
    ("SELECT * FROM IDENTIFIER('h2o')", "relation"),
    ("SELECT * FROM parquet.`/etc`", "relation"),
    ("SELECT * FROM h2o", "relation"),
    ("SELECT * FROM global_temp.x", "relation"),
    ("SELECT * FROM range(3)", "table function"),
    ("SELECT * FROM __iox_scan_0 LATERAL VIEW reflect('a', 'b') t AS x", "reflect"),
    ("SELECT /*+ FOO(t) */ 1", "hint"),
    ("WITH `a, b` AS (SELECT 1) SELECT * FROM `a, b`", "CTE name"),
    ("SELECT 1; SELECT 2", "does not parse"),
    ("SELECT current_path FROM __iox_scan_0", "CurrentPath"),  # the parser builds it: no function call to check
    ("SELECT (SELECT first(user) FROM __iox_scan_0) AS u FROM __iox_scan_0", "user()"),
    ("SELECT city FROM __iox_scan_0 o WHERE o.city <> (SELECT max(`user`) FROM __iox_scan_0)", "user()"),
]
GATE_ALLOWED = [
    "SELECT city FROM __iox_scan_0",
    "WITH h2o AS (SELECT city FROM __iox_scan_0) SELECT * FROM h2o",
    "SELECT city AS user FROM __iox_scan_0",
    "SELECT col FROM explode(array(1, 2))",
    "SELECT /*+ BROADCAST(a) */ a.city FROM __iox_scan_0 a",
    "SELECT x FROM __iox_scan_0 LATERAL VIEW explode(array(1)) t AS x",
    "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT n FROM r",
]
