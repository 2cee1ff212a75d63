package iox;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Collections;
import java.util.Optional;

import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connect.planner.SparkConnectPlanner;
import org.apache.spark.sql.connect.plugin.RelationPlugin;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * iox-batch's last gate over Spark Connect: the relation extension {@code type.googleapis.com/iox.ParsePlan}, whose
 * value is a query's text (UTF-8), is one row holding the JSON of the plan this session's own SQL parser builds for
 * that text ({@code sqlParser().parsePlan(text).toJSON()}), exactly what the in-process gate reads through py4j.
 * A parse only: nothing is analyzed, resolved or run (EXPLAIN would analyze, and analysis runs EXECUTE IMMEDIATE's
 * statement). A text that does not parse fails with Spark's own ParseException. Started by
 * {@code iox-batch spark start} (plugins/iox_planner/sparkserver.py builds this file into a jar).
 */
public final class ParsePlanPlugin implements RelationPlugin {
  static final String TYPE_URL = "type.googleapis.com/iox.ParsePlan";

  @Override
  public Optional<LogicalPlan> transform(byte[] any, SparkConnectPlanner planner) {
    // A google.protobuf.Any read by hand (field 1 type_url, field 2 value, both length-delimited), so the plugin
    // needs no protobuf classes of its own. Any other message is another plugin's.
    String typeUrl = null;
    byte[] value = new byte[0];
    int[] at = {0};
    while (at[0] < any.length) {
      long key = varint(any, at);
      if ((key & 7) != 2) {
        return Optional.empty();
      }
      long length = varint(any, at);
      if (length < 0 || length > any.length - at[0]) {
        return Optional.empty();
      }
      byte[] field = Arrays.copyOfRange(any, at[0], at[0] + (int) length);
      at[0] += (int) length;
      if ((key >>> 3) == 1) {
        typeUrl = new String(field, StandardCharsets.UTF_8);
      } else if ((key >>> 3) == 2) {
        value = field;
      }
    }
    if (!TYPE_URL.equals(typeUrl)) {
      return Optional.empty();
    }
    SparkSession session = planner.session();
    String json;
    try {
      json = session.sessionState().sqlParser().parsePlan(new String(value, StandardCharsets.UTF_8)).toJSON();
    } catch (Exception e) {
      throw ParsePlanPlugin.<RuntimeException>rethrow(e);  // Spark's ParseException, as the client knows it
    }
    StructType schema = new StructType().add("plan", DataTypes.StringType, false);
    return Optional.of(
        session.createDataFrame(Collections.singletonList(RowFactory.create(json)), schema).logicalPlan());
  }

  private static long varint(byte[] bytes, int[] at) {
    long result = 0;
    for (int shift = 0; shift < 64 && at[0] < bytes.length; shift += 7) {
      byte b = bytes[at[0]++];
      result |= (long) (b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        return result;
      }
    }
    return -1;  // cut short or too long: read as a bad length, so the message is not ours
  }

  @SuppressWarnings("unchecked")
  private static <T extends Throwable> T rethrow(Throwable e) throws T {
    throw (T) e;
  }
}
