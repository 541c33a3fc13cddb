// SPDX-License-Identifier: Apache-2.0 (this repository's own code, not Kafka's)
// No-op stand-in for Kafka's KafkaMetricsGroup so that Kafka's files compile without their dependencies (no gauges registered or read).
package org.apache.kafka.server.metrics;

import java.util.Map;
import java.util.function.Supplier;

public class KafkaMetricsGroup {
    public KafkaMetricsGroup(String group, String type) { }

    public <T> void newGauge(String name, Supplier<T> metric, Map<String, String> tags) { }

    public void removeMetric(String name, Map<String, String> tags) { }
}
