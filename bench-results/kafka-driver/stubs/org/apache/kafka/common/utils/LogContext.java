// SPDX-License-Identifier: Apache-2.0 (this repository's own code, not Kafka's)
// No-op stand-in for Kafka's LogContext so that Kafka's files compile without their dependencies.
package org.apache.kafka.common.utils;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

public class LogContext {
    public LogContext(String logPrefix) { }

    public Logger logger(Class<?> clazz) {
        return LoggerFactory.getLogger(clazz);
    }
}
