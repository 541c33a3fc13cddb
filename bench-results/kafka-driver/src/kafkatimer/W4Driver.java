// SPDX-License-Identifier: Apache-2.0
/*
 * W4Driver: this repository's own driver (Apache-2.0, like the project) of Apache Kafka's
 * DelayedOperationPurgatory and SystemTimer under workload W4, in the shape of Kafka's
 * TestPurgatoryPerformance. Kafka's own files are not part of this repository: build.sh takes
 * them from a Kafka source tree outside it (see bench-results/kafka-driver/README.md).
 *
 * It mirrors src/load.rs (`run_once_with`) workload for workload, so that its figures compare
 * like for like with ./target/release/kafka-timer's:
 *   - the draws: one splitmix64 stream (--seed), in load.rs's order: n latencies (Box-Muller,
 *     log-normal with mu = ln p50, sigma = (ln p75 - mu) / 0.674490), n exponential gaps,
 *     --keys fixed keys, then (watch model) n * --keys per-request keys;
 *   - the generator (this thread): sleeps until the next arrival when it is more than 1 ms
 *     away, otherwise issues at once (bursts); a request is tryCompleteElseWatch on the fixed
 *     keys (kafka model) or on its own (watch model);
 *   - the completer: a request whose latency is under the timeout is completed at its due time
 *     (issue + latency, rounded up to the whole millisecond, as Kafka's tool and our harness
 *     work in milliseconds): forceComplete (kafka model), or mark ready and checkAndComplete
 *     each of its keys (watch model); the timer expires the rest;
 *   - --harness-only: the same generator and completer with no purgatory and no timer (the
 *     completer logs each request at its latency, or at its timeout as an expiry);
 *   - the CPU figure: the whole process's CPU from just before the generator starts until every
 *     request has completed one way or the other, per million requests.
 * Differences, the JVM's own: warm-up runs (a short one, then --warmup requests, each with its
 * own purgatory and timer, unmeasured) come first in the same JVM; the completer waits on a
 * java.util.concurrent.DelayQueue (as Kafka's tool does) rather than our millisecond calendar
 * queue woken by the generator; requests go to it one by one, not in batches.
 */
package kafkatimer;

import org.apache.kafka.server.purgatory.DelayedOperation;
import org.apache.kafka.server.purgatory.DelayedOperationKey;
import org.apache.kafka.server.purgatory.DelayedOperationPurgatory;
import org.apache.kafka.server.util.timer.SystemTimer;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.lang.management.CompilationMXBean;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.DelayQueue;
import java.util.concurrent.Delayed;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicIntegerArray;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.LockSupport;

public final class W4Driver {
    private W4Driver() { }

    /** The flags, with load.rs's names and defaults. */
    static final class Args {
        boolean watch = false;
        long num = 1_000_000;
        double rate = 100_000.0;
        double pct50 = 20.0;
        double pct75 = 60.0;
        long timeoutMs = 200;
        long keys = 3;
        long keySpace = 100;
        long seed = 42;
        long purgeInterval = 1000;
        long warmup = 300_000;
        boolean harnessOnly = false;
        boolean json = false;

        String model() {
            return watch ? "watch" : "kafka";
        }
    }

    static final String USAGE = String.join("\n",
        "usage: W4Driver [--model kafka|watch] [--num N] [--rate R] [--pct50 MS] [--pct75 MS]",
        "                [--timeout MS] [--keys K] [--key-space S] [--seed SEED]",
        "                [--purge-interval N] [--warmup N] [--harness-only] [--json] [--progress X]",
        "W4 (Kafka's TestPurgatoryPerformance shape) on Kafka's DelayedOperationPurgatory and",
        "SystemTimer; flags as ./target/release/kafka-timer's (--progress is accepted and ignored).");

    static final class UsageError extends Exception {
        private static final long serialVersionUID = 1L;

        UsageError(String msg) {
            super(msg);
        }
    }

    /** The key objects are an array indexed by key: a key space of at most 2^24 here. */
    static final long MAX_KEY_SPACE = 1 << 24;

    static Args parse(String[] argv) throws UsageError {
        Args a = new Args();
        for (int i = 0; i < argv.length; i++) {
            String flag = argv[i];
            String value = null;
            int eq = flag.indexOf('=');
            if (flag.startsWith("--") && eq > 0) {
                value = flag.substring(eq + 1);
                flag = flag.substring(0, eq);
            }
            switch (flag) {
                case "--json":
                case "--harness-only":
                    if (value != null) throw new UsageError(flag + " takes no value");
                    if (flag.equals("--json")) a.json = true;
                    else a.harnessOnly = true;
                    continue;
                case "-h":
                case "--help":
                    System.out.println(USAGE);
                    System.exit(0);
                    break;
                default:
                    break;
            }
            if (value == null) {
                if (i + 1 >= argv.length) throw new UsageError(flag + " needs a value");
                value = argv[++i];
            }
            switch (flag) {
                case "--model":
                    if (value.equals("kafka")) a.watch = false;
                    else if (value.equals("watch")) a.watch = true;
                    else throw new UsageError("--model must be kafka or watch, not '" + value + "'");
                    break;
                case "--num": a.num = parseLong(flag, value); break;
                case "--rate": a.rate = parseDouble(flag, value); break;
                case "--pct50": a.pct50 = parseDouble(flag, value); break;
                case "--pct75": a.pct75 = parseDouble(flag, value); break;
                case "--timeout": a.timeoutMs = parseLong(flag, value); break;
                case "--keys": a.keys = parseLong(flag, value); break;
                case "--key-space": a.keySpace = parseLong(flag, value); break;
                case "--seed":
                    try {
                        a.seed = Long.parseUnsignedLong(value); // a u64, as ours
                    } catch (NumberFormatException e) {
                        throw new UsageError(flag + ": not an unsigned 64-bit integer: '" + value + "'");
                    }
                    break;
                case "--purge-interval": a.purgeInterval = parseLong(flag, value); break;
                case "--warmup": a.warmup = parseLong(flag, value); break;
                case "--progress": parseDouble(flag, value); break; // accepted, ignored
                default: throw new UsageError("unknown flag '" + flag + "'");
            }
        }
        if (a.num < 1 || a.num > Integer.MAX_VALUE - 8)
            throw new UsageError("need 1 <= --num <= " + (Integer.MAX_VALUE - 8));
        if (!(a.rate >= 1.0 && a.rate <= 1e9))
            throw new UsageError("need 1 <= --rate <= 1e9 (requests/s)");
        if (!(a.pct50 > 0.0 && a.pct75 >= a.pct50 && Double.isFinite(a.pct75)))
            throw new UsageError("need 0 < --pct50 <= --pct75, finite");
        if (a.keys < 1 || a.keySpace < 1 || a.keySpace > MAX_KEY_SPACE || a.keys > a.keySpace || a.keys > 1024)
            throw new UsageError("need 1 <= --keys <= 1024, 1 <= --key-space <= " + MAX_KEY_SPACE
                + " and --keys <= --key-space");
        if (a.watch && a.num * a.keys > Integer.MAX_VALUE - 8)
            throw new UsageError("watch model: --num x --keys must be below 2^31");
        if (a.timeoutMs < 1 || a.timeoutMs > 3_600_000)
            throw new UsageError("need 1 <= --timeout <= 3600000 (ms)");
        if (a.purgeInterval < 1 || a.purgeInterval > Integer.MAX_VALUE)
            throw new UsageError("need 1 <= --purge-interval <= 2^31-1");
        if (a.warmup < 0 || a.warmup > Integer.MAX_VALUE - 8)
            throw new UsageError("need 0 <= --warmup <= " + (Integer.MAX_VALUE - 8));
        return a;
    }

    static long parseLong(String flag, String v) throws UsageError {
        try {
            return Long.parseLong(v);
        } catch (NumberFormatException e) {
            throw new UsageError(flag + ": not an integer: '" + v + "'");
        }
    }

    static double parseDouble(String flag, String v) throws UsageError {
        try {
            double d = Double.parseDouble(v);
            if (Double.isNaN(d)) throw new NumberFormatException();
            return d;
        } catch (NumberFormatException e) {
            throw new UsageError(flag + ": not a number: '" + v + "'");
        }
    }

    /** splitmix64, exactly as src/rng.rs (u64 arithmetic: Java's wrapping longs, unsigned shifts). */
    static final class SplitMix64 {
        private long state;

        SplitMix64(long seed) {
            this.state = seed;
        }

        long next() {
            state += 0x9E3779B97F4A7C15L;
            long z = state;
            z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
            z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
            return z ^ (z >>> 31);
        }

        /** A uniform double in [0, 1) from the next output's top 53 bits. */
        double nextF64() {
            return (next() >>> 11) * 0x1.0p-53;
        }
    }

    /** The run's draws, in load.rs's order. (StrictMath: the same draws on every JVM.) */
    static final class Draws {
        final long[] latencyNs;
        final long[] gapNs;
        final int[] fixedKeys;
        final int[] keys; // watch model: request i's keys at [i * k, (i + 1) * k)

        Draws(Args a, int n) {
            SplitMix64 rng = new SplitMix64(a.seed);
            double mu = StrictMath.log(a.pct50);
            double sigma = (StrictMath.log(a.pct75) - mu) / 0.674490;
            latencyNs = new long[n];
            for (int i = 0; i < n; i++) {
                double u1 = Math.max(rng.nextF64(), Double.MIN_NORMAL);
                double u2 = rng.nextF64();
                double z = StrictMath.sqrt(-2.0 * StrictMath.log(u1)) * StrictMath.cos(2.0 * Math.PI * u2);
                latencyNs[i] = (long) (StrictMath.exp(mu + sigma * z) * 1e6);
            }
            double meanGapNs = 1e9 / a.rate;
            gapNs = new long[n];
            // Each arrival is its exact time rounded to the nanosecond, as the Rust harness's
            // whole_ns_gaps (gaps cut to whole ns made the schedule faster than --rate).
            double exact = 0.0;
            long whole = 0;
            for (int i = 0; i < n; i++) {
                exact += -StrictMath.log(1.0 - rng.nextF64()) * meanGapNs;
                long next = Math.round(exact);
                gapNs[i] = next - whole;
                whole = next;
            }
            int k = (int) a.keys;
            fixedKeys = new int[k];
            for (int j = 0; j < k; j++) {
                fixedKeys[j] = (int) Long.remainderUnsigned(rng.next(), a.keySpace);
            }
            if (a.watch) {
                keys = new int[n * k];
                for (int j = 0; j < keys.length; j++) {
                    keys[j] = (int) Long.remainderUnsigned(rng.next(), a.keySpace);
                }
            } else {
                keys = null;
            }
        }
    }

    /** A watch key: an int, as ours (u32 ids). */
    static final class IntKey implements DelayedOperationKey {
        final int key;

        IntKey(int key) {
            this.key = key;
        }

        @Override
        public String keyLabel() {
            return Integer.toUnsignedString(key);
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof IntKey && ((IntKey) o).key == key;
        }

        @Override
        public int hashCode() {
            return Integer.hashCode(key);
        }

        @Override
        public String toString() {
            return keyLabel();
        }
    }

    private static final VarHandle BYTES = MethodHandles.arrayElementVarHandle(byte[].class);

    /** Per-request state the operations, the completer and the generator share. */
    static final class Run {
        final boolean watch;
        final int n;
        /** Ready flags (watch model), a byte each, written with release and read with acquire. */
        final byte[] ready;
        /** Expired flags, set before `expiries` is incremented. */
        final byte[] expired;
        /** onComplete's time (ns since start), written before the request's count. */
        final long[] doneNs;
        /** Completions per request (exactly once expected). */
        final AtomicIntegerArray counts;
        /** Expiries (onExpiration, or the harness's logged timeouts). */
        final LongAdder expiries = new LongAdder();
        /** Completions the completer made (published once per wake-up). */
        final AtomicLong completerDone = new AtomicLong();
        volatile boolean generatorDone = false;
        long start;

        Run(boolean watch, int n) {
            this.watch = watch;
            this.n = n;
            this.ready = new byte[watch ? n : 0];
            this.expired = new byte[n];
            this.doneNs = new long[n];
            this.counts = new AtomicIntegerArray(n);
        }

        void done(int id) {
            doneNs[id] = System.nanoTime() - start;
            counts.incrementAndGet(id);
        }
    }

    /** The requests: Kafka's DelayedOperation with the run's timeout. */
    static final class FakeOperation extends DelayedOperation {
        final int id;
        final Run run;

        FakeOperation(long delayMs, int id, Run run) {
            super(delayMs);
            this.id = id;
            this.run = run;
        }

        @Override
        public boolean tryComplete() {
            if (run.watch && (byte) BYTES.getAcquire(run.ready, id) != 0) return forceComplete();
            return false;
        }

        @Override
        public void onComplete() {
            run.done(id);
        }

        @Override
        public void onExpiration() {
            BYTES.setRelease(run.expired, id, (byte) 1);
            run.expiries.increment();
        }
    }

    /** A request the completer waits for, due at a whole millisecond of the run's clock. */
    static final class Scheduled implements Delayed {
        /** The due time on System.nanoTime()'s scale: the run's start plus a whole ms. */
        final long dueNs;
        final int id;
        final FakeOperation op; // kafka model
        final boolean expires; // harness only: log as an expiry

        Scheduled(long dueNs, int id, FakeOperation op, boolean expires) {
            this.dueNs = dueNs;
            this.id = id;
            this.op = op;
            this.expires = expires;
        }

        @Override
        public long getDelay(TimeUnit unit) {
            return unit.convert(dueNs - System.nanoTime(), TimeUnit.NANOSECONDS);
        }

        @Override
        public int compareTo(Delayed o) {
            return Long.compare(dueNs, ((Scheduled) o).dueNs);
        }
    }

    /** `ns` rounded up to the whole millisecond. */
    static long ceilMs(long ns) {
        return Math.floorDiv(ns + 999_999, 1_000_000) * 1_000_000;
    }

    static long processCpuNs() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
            .getProcessCpuTime();
    }

    /** Collections and their time (ms) so far, all collectors. */
    static long[] gcCountAndMs() {
        long[] r = new long[2];
        for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
            r[0] += Math.max(0, gc.getCollectionCount());
            r[1] += Math.max(0, gc.getCollectionTime());
        }
        return r;
    }

    /** The JIT compilers' time so far (ms), if the JVM reports it. */
    static long jitMs() {
        CompilationMXBean c = ManagementFactory.getCompilationMXBean();
        return c != null && c.isCompilationTimeMonitoringSupported() ? c.getTotalCompilationTime() : 0;
    }

    static Thread threadNamed(String name) {
        for (Thread t : Thread.getAllStackTraces().keySet()) {
            if (t.getName().equals(name)) return t;
        }
        return null;
    }

    static long threadCpuNs(ThreadMXBean mx, Thread t) {
        if (t == null) return 0;
        long v = mx.getThreadCpuTime(t.getId());
        return Math.max(v, 0);
    }

    /**
     * The generator's and the completer's work for one run, in small methods (so the JIT
     * compiles them during the warm-up as ordinary methods, not again inside the measured run).
     */
    static final class Harness {
        final Run run;
        final DelayedOperationPurgatory<FakeOperation> purgatory; // null: harness only
        final DelayQueue<Scheduled> queue = new DelayQueue<>();
        final long[] latencyNs;
        final long[] gapNs;
        final int[] keys; // watch model
        final IntKey[] keyObjs;
        final List<IntKey> fixedKeys;
        final long[] issueNs;
        final long timeoutMs;
        final long timeoutNs;
        final int k;
        final boolean watch;
        final long start;
        /** The schedule's arrival time of the last request issued (ns since start). */
        long arrival = 0;

        Harness(Args a, Draws d, Run run, DelayedOperationPurgatory<FakeOperation> purgatory,
                IntKey[] keyObjs, List<IntKey> fixedKeys, long[] issueNs, long start) {
            this.run = run;
            this.purgatory = purgatory;
            this.latencyNs = d.latencyNs;
            this.gapNs = d.gapNs;
            this.keys = d.keys;
            this.keyObjs = keyObjs;
            this.fixedKeys = fixedKeys;
            this.issueNs = issueNs;
            this.timeoutMs = a.timeoutMs;
            this.timeoutNs = a.timeoutMs * 1_000_000L;
            this.k = (int) a.keys;
            this.watch = a.watch;
            this.start = start;
        }

        /** The generator: requests 0 to n - 1. */
        void generate(int n) {
            for (int i = 0; i < n; i++) issue(i);
        }

        /**
         * The generator's request i: sleeps until its arrival when that is more than 1 ms away,
         * otherwise issues it at once (bursts); then tryCompleteElseWatch, and hands it to the
         * completer if its latency is under the timeout (harness only: every request, the
         * others as expiries at the timeout).
         */
        void issue(int i) {
            arrival += gapNs[i];
            long issue = System.nanoTime() - start;
            if (arrival > issue + 1_000_000) {
                long rem;
                while ((rem = arrival - issue) > 0) {
                    LockSupport.parkNanos(rem);
                    issue = System.nanoTime() - start;
                }
            }
            issueNs[i] = issue;
            long lat = latencyNs[i];
            if (purgatory == null) {
                boolean expires = lat >= timeoutNs;
                queue.offer(new Scheduled(start + ceilMs(issue + (expires ? timeoutNs : lat)), i, null, expires));
                return;
            }
            FakeOperation op = new FakeOperation(timeoutMs, i, run);
            boolean completedNow = purgatory.tryCompleteElseWatch(op, keysOf(i));
            if (lat < timeoutNs && !completedNow) {
                queue.offer(new Scheduled(start + ceilMs(issue + lat), i, watch ? null : op, false));
            }
        }

        List<IntKey> keysOf(int i) {
            if (!watch) return fixedKeys;
            IntKey[] arr = new IntKey[k];
            for (int j = 0; j < k; j++) arr[j] = keyObjs[keys[i * k + j]];
            return Arrays.asList(arr);
        }

        /**
         * One wake-up of the completer: waits up to 100 ms for a due request, then completes
         * every one already due. False once the generator is done and nothing is left.
         */
        boolean completerStep() throws InterruptedException {
            Scheduled s = queue.poll(100, TimeUnit.MILLISECONDS);
            if (s != null) {
                long local = 0;
                do {
                    local += complete(s);
                    s = queue.poll();
                } while (s != null);
                if (local > 0) run.completerDone.addAndGet(local);
            }
            return !(run.generatorDone && queue.isEmpty());
        }

        /** The completer's action for one due request; the completions it made. */
        long complete(Scheduled s) {
            if (purgatory == null) {
                // Harness only: log what onComplete (or the expiry) would have.
                if (s.expires) {
                    BYTES.setRelease(run.expired, s.id, (byte) 1);
                    run.done(s.id);
                    run.expiries.increment();
                    return 0;
                }
                run.done(s.id);
                return 1;
            }
            if (!watch) {
                return s.op.forceComplete() ? 1 : 0;
            }
            BYTES.setRelease(run.ready, s.id, (byte) 1);
            long c = 0;
            int base = s.id * k;
            for (int j = 0; j < k; j++) c += purgatory.checkAndComplete(keyObjs[keys[base + j]]);
            return c;
        }
    }

    /** What a run reports. */
    static final class Report {
        int n;
        double achievedRate;
        double elapsedS;
        double generationS;
        long cpuNs;
        Map<String, Long> cpuByThread = new LinkedHashMap<>();
        long completed;
        long expired;
        long expectedExpired;
        long expiredBelowTimeout;
        long completedEarly;
        long notExactlyOnce;
        long completions;
        double[] delayMs = new double[3];
        boolean allDone;
        long gcCount;
        long gcMs;
        long jitMs;
    }

    static Report runOnce(Args a, int n, String name) throws Exception {
        final boolean watch = a.watch;
        final int k = (int) a.keys;
        final long timeoutNs = a.timeoutMs * 1_000_000L;
        Draws d = new Draws(a, n);
        long expectedExpired = countAtLeast(d.latencyNs, timeoutNs);

        // The key objects, made once up front (the drawn ones).
        IntKey[] keyObjs = new IntKey[(int) a.keySpace];
        List<IntKey> fixed = new ArrayList<>(k);
        for (int j = 0; j < k; j++) fixed.add(key(keyObjs, d.fixedKeys[j]));
        final List<IntKey> fixedKeys = List.copyOf(fixed);
        if (watch) keyObjects(keyObjs, d.keys);

        final Run run = new Run(watch, n);
        final long[] issueNs = new long[n];
        final SystemTimer timer;
        final DelayedOperationPurgatory<FakeOperation> purgatory;
        Set<Thread> before = Thread.getAllStackTraces().keySet();
        if (a.harnessOnly) {
            timer = null;
            purgatory = null;
        } else {
            // Kafka's defaults: tick 1 ms, wheel 20; the reaper and the timer enabled.
            timer = new SystemTimer(name);
            purgatory = new DelayedOperationPurgatory<>(name, timer, 0, (int) a.purgeInterval, true, true);
        }
        ThreadMXBean mx = ManagementFactory.getThreadMXBean();
        // The purgatory's reaper: Kafka names it "ExpirationReaper-<brokerId>-<purgatoryName>",
        // but builds it before the name is set ("ExpirationReaper-0-null"): the new one.
        Thread reaper = null;
        for (Thread t : Thread.getAllStackTraces().keySet()) {
            if (t.getName().startsWith("ExpirationReaper-0-") && !before.contains(t)) reaper = t;
        }
        long reaper0 = threadCpuNs(mx, reaper);
        final long[] completerCpu = new long[1];

        long[] gc0 = gcCountAndMs();
        long jit0 = jitMs();
        long cpu0 = processCpuNs();
        long main0 = mx.getCurrentThreadCpuTime();
        final long start = System.nanoTime();
        run.start = start;

        final Harness h = new Harness(a, d, run, purgatory, keyObjs, fixedKeys, issueNs, start);
        Thread completer = new Thread(() -> {
            try {
                while (h.completerStep()) {
                    // until the generator is done and nothing is left to complete
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            } finally {
                completerCpu[0] = ManagementFactory.getThreadMXBean().getCurrentThreadCpuTime();
            }
        }, "w4-completer");
        completer.setDaemon(true);
        completer.start();

        // The generator (this thread).
        h.generate(n);
        final long arrival = h.arrival;
        long genEnd = System.nanoTime() - start;
        run.generatorDone = true;
        long main1 = mx.getCurrentThreadCpuTime();

        // Wait (generously) until every request has completed one way or the other.
        long deadline = System.nanoTime() + (a.timeoutMs + 30_000L) * 1_000_000L;
        waitForAll(run, n, deadline);
        completer.join(Math.max(1, (deadline - System.nanoTime()) / 1_000_000L));
        long elapsed = System.nanoTime() - start;
        long cpu = processCpuNs() - cpu0;
        long[] gc1 = gcCountAndMs();
        long jit1 = jitMs();

        Report r = new Report();
        r.n = n;
        r.cpuByThread.put("generator", main1 - main0);
        r.cpuByThread.put("completer", completerCpu[0]);
        if (!a.harnessOnly) {
            r.cpuByThread.put("reaper", threadCpuNs(mx, reaper) - reaper0);
            r.cpuByThread.put("executor", threadCpuNs(mx, threadNamed("executor-" + name)));
        }
        long named = 0;
        for (long v : r.cpuByThread.values()) named += v;
        r.cpuByThread.put("other (GC, JIT, VM, waiting)", Math.max(0, cpu - named));

        if (purgatory != null) {
            purgatory.shutdown(); // the reaper, then timer.close()
            timer.close();
        }

        tally(r, run, d.latencyNs, issueNs, timeoutNs);
        r.achievedRate = n / (Math.max(genEnd, arrival) / 1e9);
        r.elapsedS = elapsed / 1e9;
        r.generationS = genEnd / 1e9;
        r.cpuNs = cpu;
        r.gcCount = gc1[0] - gc0[0];
        r.gcMs = gc1[1] - gc0[1];
        r.jitMs = jit1 - jit0;
        r.expectedExpired = expectedExpired;
        return r;
    }

    // The loops of a run outside the generator and the completer, each in a method of its own:
    // inside runOnce they made it hot enough for the JIT to compile the whole of it (hundreds of
    // ms of a compiler thread) during the measured run.

    /** How many of `values` are at least `t`. */
    static long countAtLeast(long[] values, long t) {
        long c = 0;
        for (long v : values) if (v >= t) c++;
        return c;
    }

    /** Makes the key objects of `keys`. */
    static void keyObjects(IntKey[] keyObjs, int[] keys) {
        for (int kk : keys) key(keyObjs, kk);
    }

    /** Waits (1 ms sleeps) until every request has completed one way or the other, or `deadline`. */
    static void waitForAll(Run run, int n, long deadline) throws InterruptedException {
        while (run.completerDone.get() + run.expiries.sum() < n && System.nanoTime() < deadline) {
            Thread.sleep(1);
        }
    }

    /** The tally: every request exactly once; expired ones; completions before their due time. */
    static void tally(Report r, Run run, long[] latencyNs, long[] issueNs, long timeoutNs) {
        int n = run.n;
        long expiriesSeen = run.expiries.sum();
        long completions = 0;
        long notOnce = 0;
        long completed = 0;
        long expired = 0;
        long belowTimeout = 0;
        long early = 0;
        double[] delays = new double[n];
        int nd = 0;
        for (int i = 0; i < n; i++) {
            int c = run.counts.get(i);
            completions += c;
            if (c != 1) notOnce++;
            if (c == 0) continue;
            if ((byte) BYTES.getAcquire(run.expired, i) != 0) {
                expired++;
                if (latencyNs[i] < timeoutNs) belowTimeout++;
            } else {
                completed++;
                long due = issueNs[i] + latencyNs[i];
                if (run.doneNs[i] < due) early++;
                delays[nd++] = (run.doneNs[i] - due) / 1e6;
            }
        }
        Arrays.sort(delays, 0, nd);
        r.delayMs[0] = percentile(delays, nd, 0.50);
        r.delayMs[1] = percentile(delays, nd, 0.99);
        r.delayMs[2] = nd > 0 ? delays[nd - 1] : 0.0;
        r.completed = completed;
        r.expired = expired;
        r.expiredBelowTimeout = belowTimeout;
        r.completedEarly = early;
        r.notExactlyOnce = notOnce;
        r.completions = completions;
        r.allDone = completions == n && run.completerDone.get() + expiriesSeen == n;
    }

    static IntKey key(IntKey[] keyObjs, int k) {
        IntKey o = keyObjs[k];
        if (o == null) keyObjs[k] = o = new IntKey(k);
        return o;
    }

    static double percentile(double[] sorted, int len, double q) {
        if (len == 0) return 0.0;
        int idx = (int) Math.ceil(q * len);
        idx = Math.min(Math.max(idx, 1), len);
        return sorted[idx - 1];
    }

    static String json(Args a, Report r) {
        StringBuilder s = new StringBuilder("{");
        Map<String, String> f = new LinkedHashMap<>();
        f.put("impl", q("kafka-java"));
        f.put("model", q(a.model()));
        f.put("num", Long.toString(r.n));
        f.put("pct50_ms", fmt("%s", a.pct50));
        f.put("pct75_ms", fmt("%s", a.pct75));
        f.put("timeout_ms", Long.toString(a.timeoutMs));
        f.put("keys", Long.toString(a.keys));
        f.put("key_space", Long.toString(a.keySpace));
        f.put("purge_interval", Long.toString(a.purgeInterval));
        f.put("seed", Long.toUnsignedString(a.seed));
        f.put("warmup_requests", Long.toString(a.warmup));
        f.put("target_rate", fmt("%.1f", a.rate));
        f.put("achieved_rate", fmt("%.1f", r.achievedRate));
        f.put("generation_s", fmt("%.3f", r.generationS));
        f.put("elapsed_s", fmt("%.3f", r.elapsedS));
        f.put("cpu_s", fmt("%.3f", r.cpuNs / 1e9));
        f.put("cpu_s_per_million", fmt("%.3f", perMillion(r.cpuNs, r.n)));
        StringBuilder by = new StringBuilder("{");
        for (Map.Entry<String, Long> e : r.cpuByThread.entrySet()) {
            if (by.length() > 1) by.append(',');
            by.append(q(e.getKey())).append(':').append(fmt("%.3f", perMillion(e.getValue(), r.n)));
        }
        f.put("cpu_s_per_million_by_thread", by.append('}').toString());
        f.put("completed", Long.toString(r.completed));
        f.put("expired", Long.toString(r.expired));
        f.put("expected_expired", Long.toString(r.expectedExpired));
        f.put("expired_below_timeout", Long.toString(r.expiredBelowTimeout));
        f.put("completed_early", Long.toString(r.completedEarly));
        f.put("all_completed", Boolean.toString(r.allDone));
        f.put("exactly_once", Boolean.toString(r.notExactlyOnce == 0));
        f.put("not_exactly_once", Long.toString(r.notExactlyOnce));
        f.put("completion_delay_ms", fmt("{\"p50\":%.4f,\"p99\":%.4f,\"max\":%.4f}",
            r.delayMs[0], r.delayMs[1], r.delayMs[2]));
        f.put("gc_count", Long.toString(r.gcCount));
        f.put("gc_time_ms", Long.toString(r.gcMs));
        f.put("jit_time_ms", Long.toString(r.jitMs));
        f.put("harness_only", Boolean.toString(a.harnessOnly));
        f.put("java_version", q(System.getProperty("java.version")));
        f.put("jvm_args", q(String.join(" ", ManagementFactory.getRuntimeMXBean().getInputArguments())));
        for (Map.Entry<String, String> e : f.entrySet()) {
            if (s.length() > 1) s.append(',');
            s.append(q(e.getKey())).append(':').append(e.getValue());
        }
        return s.append('}').toString();
    }

    static String table(Args a, Report r) {
        StringBuilder s = new StringBuilder();
        s.append(fmt("W4 on Kafka's DelayedOperationPurgatory + SystemTimer (Java %s): model %s, %d requests at %.0f/s, "
                + "latency p50 %s ms p75 %s ms, timeout %d ms, %d keys of %d, seed %s%s%n",
            System.getProperty("java.version"), a.model(), r.n, a.rate, a.pct50, a.pct75, a.timeoutMs,
            a.keys, a.keySpace, Long.toUnsignedString(a.seed), a.harnessOnly ? ", harness only (no purgatory)" : ""));
        String row = "%-34s %s%n";
        s.append(fmt(row, "target rate (req/s)", fmt("%.0f", a.rate)));
        s.append(fmt(row, "achieved rate (req/s)", fmt("%.0f", r.achievedRate)));
        s.append(fmt(row, "elapsed (s)", fmt("%.2f", r.elapsedS)));
        s.append(fmt(row, "CPU s per million requests", fmt("%.2f", perMillion(r.cpuNs, r.n))));
        StringBuilder by = new StringBuilder();
        for (Map.Entry<String, Long> e : r.cpuByThread.entrySet()) {
            if (by.length() > 0) by.append(", ");
            by.append(e.getKey()).append(' ').append(fmt("%.2f", perMillion(e.getValue(), r.n)));
        }
        s.append(fmt(row, "  by thread: CPU s/M", by));
        s.append(fmt(row, "GC (during the run)", fmt("%d collections, %d ms; JIT %d ms", r.gcCount, r.gcMs, r.jitMs)));
        s.append(fmt(row, "completed (not expired)", r.completed));
        s.append(fmt(row, "expired (expected)", fmt("%d (%d)", r.expired, r.expectedExpired)));
        s.append(fmt(row, "completion delay ms p50/p99/max",
            fmt("%.3f / %.3f / %.3f", r.delayMs[0], r.delayMs[1], r.delayMs[2])));
        s.append(fmt(row, "every request exactly once", r.notExactlyOnce == 0 && r.allDone
            ? "yes" : fmt("NO (%d not exactly once, %d completions)", r.notExactlyOnce, r.completions)));
        return s.toString();
    }

    static double perMillion(long ns, int n) {
        return ns / 1e9 / n * 1e6;
    }

    static String fmt(String f, Object... args) {
        return String.format(Locale.ROOT, f, args);
    }

    static String q(String t) {
        StringBuilder s = new StringBuilder("\"");
        for (char c : t.toCharArray()) {
            if (c == '"' || c == '\\') s.append('\\').append(c);
            else if (c < 0x20) s.append(fmt("\\u%04x", (int) c));
            else s.append(c);
        }
        return s.append('"').toString();
    }

    public static void main(String[] argv) throws Exception {
        Args a;
        try {
            a = parse(argv);
        } catch (UsageError e) {
            System.err.println("W4Driver: " + e.getMessage());
            System.err.println(USAGE);
            System.exit(2);
            return;
        }
        if (a.warmup > 0) {
            // A short round first, so that the warm-up proper runs (and the JIT compiles) with
            // every path of a run already taken once: the end of the generator, the timer's and
            // the purgatory's shutdown. Code compiled without them is thrown away when a run
            // ends, and compiled again inside the next run (measured here as JIT time).
            int first = (int) Math.min(a.warmup, 20_000);
            System.err.printf(Locale.ROOT, "warm-up: %d + %d requests (unmeasured)%n", first, a.warmup);
            runOnce(a, first, "w4-warmup0");
            runOnce(a, (int) a.warmup, "w4-warmup");
            System.gc();
        }
        Report r = runOnce(a, (int) a.num, "w4");
        if (a.json) System.out.println(json(a, r));
        else System.out.print(table(a, r));
        System.out.flush();
        boolean ok = r.notExactlyOnce == 0 && r.allDone;
        System.exit(ok ? 0 : 1);
    }
}
