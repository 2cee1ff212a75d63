"""The one seam to Spark, importing no pyspark: the settings of every session and spark-submit (`conf.py`), a
query's wall-time budget (`budget.py`), the spark-submit command and its run (`submit.py`), the typed specs of
every job (`jobs.py`), and the runner setting with the launcher that runs jobs through spark-submit
(`launch.py`). The in-process launcher and the one job wrapper are `spark_jobs/launch.py` and `spark_jobs/job.py`."""
