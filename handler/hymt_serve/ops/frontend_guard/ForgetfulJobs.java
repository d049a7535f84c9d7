package org.hymt.frontend;

import io.netty.channel.Channel;
import java.lang.reflect.Field;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import org.pytorch.serve.job.Job;
import org.pytorch.serve.util.messages.RequestInput;
import org.pytorch.serve.util.messages.WorkerCommands;

/**
 * An async worker's {@code jobs_in_backend}: thread-safe, and it lets go of a job once its last
 * reply is written, whatever that reply was.
 *
 * <p>TorchServe 0.12.0's {@code AsyncBatchAggregator} removes a job from that map only at a
 * reply marked as a stream's last part ({@code ts_stream_next: false}). A whole reply (every
 * error our handler sends, the management API's describe calls) and an error the front end
 * sends itself ({@code Job.sendError}) leave the job, its request and its Netty context in the
 * map for good: about 4 KB of heap per request.
 *
 * <p>So every job put here is wrapped in a {@link Tracked} job that hands each reply on to the
 * real one and then, when the reply was the request's last (whole, or an error), removes itself.
 * Stream parts leave it in; a stream's last part is removed by TorchServe itself.
 *
 * <p>A reply can still come after an error: TorchServe answers every request of the worker with
 * an error when one reply comes back as a failure, and their own replies follow later. The map
 * then looked those requests up, found them and wrote to a closed connection; a lookup that
 * misses would throw and cost the worker its connection. So the ids of requests forgotten at an
 * error are kept a while (the last {@link #LATE_IDS}), and a lookup of one of them gets a job
 * that drops the reply.
 *
 * <p>A request whose worker process died is never answered by TorchServe 0.12.0 in async mode:
 * its client waits until it gives up, and the request stays. Each job notes the connection to
 * the worker process it was sent on; {@link #sweep} (called by the plugin's watcher) answers
 * those whose connection has been closed for {@link #ORPHAN_GRACE_MS} with 503 "Worker died."
 * and lets go of them. Their requests can only be answered over that connection.
 */
final class ForgetfulJobs extends ConcurrentHashMap<String, Job> {
    private static final long serialVersionUID = 1L;
    static final int LATE_IDS = 4096;
    static final long ORPHAN_GRACE_MS = 2000;

    /** Jobs let go of at a whole reply or an error, over every map (TorchServe would keep them). */
    static final AtomicLong forgotten = new AtomicLong();
    /** Replies that came for a request already forgotten at an error, and were dropped. */
    static final AtomicLong lateReplies = new AtomicLong();
    /** Requests answered 503 because the worker process they were sent to was gone. */
    static final AtomicLong orphaned = new AtomicLong();

    private final transient Object worker; // the WorkerThread whose aggregator holds this map
    private final transient Field backendChannel; // WorkerThread.backendChannel, accessible

    // ids of requests forgotten at an error, oldest first, at most LATE_IDS
    private final Set<String> lateIds =
            Collections.newSetFromMap(
                    Collections.synchronizedMap(
                            new LinkedHashMap<String, Boolean>() {
                                private static final long serialVersionUID = 1L;

                                @Override
                                protected boolean removeEldestEntry(Map.Entry<String, Boolean> e) {
                                    return size() > LATE_IDS;
                                }
                            }));

    ForgetfulJobs(Object worker, Field backendChannel) {
        this.worker = worker;
        this.backendChannel = backendChannel;
    }

    @Override
    public Job put(String id, Job job) {
        Job real = job instanceof Tracked ? ((Tracked) job).real : job; // re-queued by an error
        return super.put(id, new Tracked(real, this, channel()));
    }

    /** The connection to the worker process now; TorchServe calls put on the worker's thread. */
    private Channel channel() {
        try {
            List<?> channels = (List<?>) backendChannel.get(worker);
            Object first = channels.isEmpty() ? null : channels.get(0);
            return first instanceof Channel ? (Channel) first : null;
        } catch (IllegalAccessException | RuntimeException e) {
            return null; // not swept, then: answered as TorchServe answers it
        }
    }

    /** Answer 503 to each request whose worker connection has been closed a while, and forget it. */
    void sweep(long now) {
        for (Job job : values()) {
            if (!(job instanceof Tracked)) {
                continue;
            }
            Tracked tracked = (Tracked) job;
            if (tracked.channel == null || tracked.channel.isActive()) {
                continue;
            }
            if (tracked.closedSince == 0) {
                tracked.closedSince = now; // a reply read just before the close may still come
            } else if (now - tracked.closedSince >= ORPHAN_GRACE_MS
                    && remove(tracked.getJobId(), tracked)) {
                orphaned.incrementAndGet();
                lateIds.add(tracked.getJobId());
                tracked.real.sendError(503, "Worker died.");
            }
        }
    }

    @Override
    public Job get(Object id) {
        Job job = super.get(id);
        if (job == null && id instanceof String && lateIds.contains(id)) {
            lateReplies.incrementAndGet();
            return new Dropped((String) id);
        }
        return job;
    }

    /** Called by a tracked job after its last reply. */
    void finished(Tracked job, boolean afterError) {
        String id = job.getJobId();
        if (remove(id, job)) {
            forgotten.incrementAndGet();
            if (afterError) {
                lateIds.add(id);
            }
        }
    }

    /** A job whose replies go to the real one; after its last reply it leaves the map. */
    static final class Tracked extends Job {
        final Job real;
        final Channel channel; // the worker connection it was sent on (null: unknown)
        long closedSince; // when the sweep first saw that connection closed (its thread only)
        private final ForgetfulJobs owner;

        Tracked(Job real, ForgetfulJobs owner, Channel channel) {
            super(real.getModelName(), real.getModelVersion(), real.getCmd(), real.getPayload());
            this.real = real;
            this.owner = owner;
            this.channel = channel;
        }

        @Override
        public void response(
                byte[] body,
                CharSequence contentType,
                int statusCode,
                String statusPhrase,
                Map<String, String> responseHeaders) {
            try {
                real.response(body, contentType, statusCode, statusPhrase, responseHeaders);
            } finally {
                boolean part =
                        getCmd() != WorkerCommands.DESCRIBE
                                && responseHeaders != null
                                && responseHeaders.containsKey(RequestInput.TS_STREAM_NEXT);
                if (!part) { // a stream's parts, its last included, are TorchServe's to remove
                    owner.finished(this, false);
                }
            }
        }

        @Override
        public void sendError(int status, String error) {
            try {
                real.sendError(status, error);
            } finally {
                owner.finished(this, true);
            }
        }

        @Override
        public boolean isOpen() {
            return real.isOpen();
        }

        @Override
        public void setScheduled() {
            real.setScheduled();
        }

        @Override
        public long getBegin() {
            return real.getBegin();
        }

        @Override
        public long getScheduled() {
            return real.getScheduled();
        }

        @Override
        public String getGroupId() {
            return real.getGroupId();
        }
    }

    /** Stands in for a request forgotten at an error: its late replies go nowhere. */
    static final class Dropped extends Job {
        Dropped(String id) {
            super(null, null, WorkerCommands.PREDICT, new RequestInput(id));
        }

        @Override
        public void response(
                byte[] body,
                CharSequence contentType,
                int statusCode,
                String statusPhrase,
                Map<String, String> responseHeaders) {
            // the client had its error already
        }

        @Override
        public void sendError(int status, String error) {
            // the client had its error already
        }

        @Override
        public boolean isOpen() {
            return false;
        }
    }
}
