package org.hymt.frontend;

import java.io.IOException;
import java.io.OutputStream;
import java.lang.ref.WeakReference;
import java.lang.reflect.Field;
import java.util.ArrayList;
import java.nio.charset.StandardCharsets;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.WeakHashMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;
import org.pytorch.serve.servingsdk.Context;
import org.pytorch.serve.servingsdk.ModelServerEndpoint;
import org.pytorch.serve.servingsdk.annotations.Endpoint;
import org.pytorch.serve.servingsdk.annotations.helpers.EndpointTypes;
import org.pytorch.serve.servingsdk.http.Request;
import org.pytorch.serve.servingsdk.http.Response;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Guards TorchServe 0.12.0's async mode against a race in its own front end, and against its
 * keeping every request answered with a whole reply.
 *
 * <p>In async mode each worker's {@code AsyncBatchAggregator} keeps the requests it has sent to
 * the backend in {@code jobs_in_backend}, a plain {@code LinkedHashMap}. The worker's thread adds
 * to it as it sends requests; the connection's event-loop thread looks replies up in it and
 * removes them. Nothing synchronises the two, so under load a lookup can miss (while an insert
 * resizes the table, say): the front end then throws "Unexpected job in sendResponse()", drops
 * the worker's connection, and every request in that map goes unanswered until its client gives
 * up (seen with 256 concurrent users). And it removes a request only at a stream's last part,
 * so every error reply and every describe call stays in the heap for good.
 *
 * <p>This plugin (loaded by TorchServe from {@code plugins_path} at start-up, before any model)
 * watches the workers and gives each new worker's aggregator a {@link ForgetfulJobs} map (a
 * {@link ConcurrentHashMap} that lets go of a request after its last reply) in place of that map
 * while the worker is still loading its model, when nothing has been put in it yet and no other
 * thread uses it. Every use of the map in 0.12.0 (put, get, remove, clear, isEmpty, iterating its
 * entries) is then thread-safe. A worker first seen with its model already loaded is left alone
 * and counted as unguarded (its map may be in use).
 *
 * <p>{@code GET /hymt-frontend-guard} on the management API reports the counts as JSON.
 */
@Endpoint(
        urlPattern = "hymt-frontend-guard",
        endpointType = EndpointTypes.MANAGEMENT,
        description = "Reports which workers' request maps are thread-safe (hymt frontend guard)")
public class HymtFrontendGuard extends ModelServerEndpoint {
    private static final Logger logger = LoggerFactory.getLogger(HymtFrontendGuard.class);
    private static final long PERIOD_MS = 20;
    private static final String ASYNC_AGGREGATOR = "org.pytorch.serve.wlm.AsyncBatchAggregator";
    private static final String LOADED = "WORKER_MODEL_LOADED";

    private static final AtomicInteger guarded = new AtomicInteger();
    private static final AtomicInteger unguarded = new AtomicInteger();
    private static final AtomicInteger errors = new AtomicInteger();
    // Aggregators seen already (guarded or not), by identity; only the watcher uses it, and a
    // worker that is gone lets go of its aggregator.
    private static final Set<Object> seen = Collections.newSetFromMap(new WeakHashMap<>());
    // the maps installed (held weakly: a worker that is gone lets go of its map; a list, as
    // maps compare by their contents)
    private static final List<WeakReference<ForgetfulJobs>> installed =
            new CopyOnWriteArrayList<>();
    private static volatile String lastError = "";
    private static Thread watcher;

    public HymtFrontendGuard() {
        startWatcher();
    }

    private static synchronized void startWatcher() {
        if (watcher != null) {
            return; // ServiceLoader makes one instance per endpoint type asked for
        }
        watcher = new Thread(HymtFrontendGuard::watch, "hymt-frontend-guard");
        watcher.setDaemon(true);
        watcher.start();
        logger.info("hymt frontend guard: watching workers for async request maps");
    }

    private static void watch() {
        while (true) {
            try {
                scan();
            } catch (ReflectiveOperationException e) {
                // not the classes and fields of TorchServe 0.12.0: nothing to guard here
                errors.incrementAndGet();
                lastError = e.toString();
                logger.error("hymt frontend guard: stopped, this TorchServe is not 0.12.0's", e);
                return;
            } catch (RuntimeException e) {
                if (errors.incrementAndGet() <= 3) {
                    logger.warn("hymt frontend guard: scan failed", e);
                }
                lastError = e.toString();
            }
            try {
                Thread.sleep(PERIOD_MS);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    /** One pass over every worker of every model. */
    static void scan() throws ReflectiveOperationException {
        Class<?> managerClass = Class.forName("org.pytorch.serve.wlm.ModelManager");
        Object manager = managerClass.getMethod("getInstance").invoke(null);
        if (manager == null) {
            return; // the server has not set up its models yet
        }
        Object workload = field(managerClass, "wlm").get(manager);
        Map<?, ?> byModel = (Map<?, ?>) field(workload.getClass(), "workers").get(workload);
        for (Object list : byModel.values()) {
            // a plain ArrayList that TorchServe may add to meanwhile: toArray copies without
            // failing; a slot not yet filled reads null
            for (Object worker : ((Collection<?>) list).toArray()) {
                if (worker != null) {
                    visit(worker);
                }
            }
        }
        long now = System.currentTimeMillis();
        for (ForgetfulJobs map : installedMaps()) {
            map.sweep(now);
        }
    }

    /** The maps installed whose workers are still there. */
    private static List<ForgetfulJobs> installedMaps() {
        List<ForgetfulJobs> maps = new ArrayList<>();
        for (WeakReference<ForgetfulJobs> ref : installed) {
            ForgetfulJobs map = ref.get();
            if (map == null) {
                installed.remove(ref);
            } else {
                maps.add(map);
            }
        }
        return maps;
    }

    private static void visit(Object worker) throws ReflectiveOperationException {
        Object aggregator = field(worker.getClass(), "aggregator").get(worker);
        if (aggregator == null || seen.contains(aggregator)) {
            return;
        }
        if (!isAsync(aggregator.getClass())) {
            seen.add(aggregator); // TorchServe's batch mode: one thread uses its maps
            return;
        }
        Field jobs = field(aggregator.getClass(), "jobs_in_backend");
        Object state = field(worker.getClass(), "state").get(worker);
        Map<?, ?> current = (Map<?, ?>) jobs.get(aggregator);
        seen.add(aggregator);
        if (current instanceof ConcurrentHashMap) {
            guarded.incrementAndGet();
        } else if (current != null && current.isEmpty() && !LOADED.equals(String.valueOf(state))) {
            ForgetfulJobs replacement =
                    new ForgetfulJobs(worker, field(worker.getClass(), "backendChannel"));
            jobs.set(aggregator, replacement);
            installed.add(new WeakReference<>(replacement));
            guarded.incrementAndGet();
            logger.info(
                    "hymt frontend guard: worker {}'s request map is now thread-safe and forgets"
                            + " answered requests",
                    name(worker));
        } else {
            unguarded.incrementAndGet();
            logger.warn(
                    "hymt frontend guard: worker {} was first seen with its model loaded ({}); its"
                            + " request map stays TorchServe's own, unsynchronised",
                    name(worker),
                    state);
        }
    }

    private static boolean isAsync(Class<?> type) {
        for (Class<?> c = type; c != null; c = c.getSuperclass()) {
            if (ASYNC_AGGREGATOR.equals(c.getName())) {
                return true;
            }
        }
        return false;
    }

    private static String name(Object worker) {
        try {
            return String.valueOf(field(worker.getClass(), "workerId").get(worker));
        } catch (ReflectiveOperationException | RuntimeException e) {
            return "?";
        }
    }

    /** A declared field of {@code type} or of a class above it, made accessible. */
    private static Field field(Class<?> type, String name) throws NoSuchFieldException {
        for (Class<?> c = type; c != null; c = c.getSuperclass()) {
            try {
                Field found = c.getDeclaredField(name);
                found.setAccessible(true);
                return found;
            } catch (NoSuchFieldException e) {
                // look in the superclass
            }
        }
        throw new NoSuchFieldException(type.getName() + "." + name);
    }

    private static String json(String text) {
        StringBuilder out = new StringBuilder();
        for (char c : text.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.toString();
    }

    private static int inBackend() {
        int total = 0;
        for (ForgetfulJobs map : installedMaps()) {
            total += map.size();
        }
        return total;
    }

    @Override
    public void doGet(Request req, Response rsp, Context ctx) throws IOException {
        String body =
                String.format(
                        "{\"guarded\": %d, \"unguarded\": %d, \"scan_errors\": %d,"
                                + " \"last_error\": \"%s\", \"in_backend\": %d,"
                                + " \"forgotten\": %d, \"late_replies\": %d,"
                                + " \"worker_died\": %d}",
                        guarded.get(),
                        unguarded.get(),
                        errors.get(),
                        json(lastError),
                        inBackend(),
                        ForgetfulJobs.forgotten.get(),
                        ForgetfulJobs.lateReplies.get(),
                        ForgetfulJobs.orphaned.get());
        rsp.setStatus(200);
        rsp.setContentType("application/json");
        try (OutputStream out = rsp.getOutputStream()) {
            out.write(body.getBytes(StandardCharsets.UTF_8));
        }
    }
}
