// A job-queue worker over pgfence with JDBC (docs/clients.md).
//
// Usage: java -cp /usr/share/java/postgresql.jar Worker.java JDBC_URL WORKER_NAME.
// Environment: TTL (seconds, default 2), MAX_JOBS (jobs to claim; 0: until the queue is empty).
import java.sql.*;
import java.util.concurrent.*;

public class Worker {
    static final double TTL = Double.parseDouble(System.getenv().getOrDefault("TTL", "2"));
    static final int MAX_JOBS = Integer.parseInt(System.getenv().getOrDefault("MAX_JOBS", "0"));
    static final double MARGIN = TTL / 10; // stop side effects this long before the lease could pass on
    static String url, worker;

    static double now() { return System.nanoTime() / 1e9; } // monotonic seconds

    // prepareThreshold=0: the driver never switches to named server-side
    // statements, which PgBouncer in transaction mode would break.
    static Connection connect() throws SQLException {
        var props = new java.util.Properties();
        props.setProperty("prepareThreshold", "0");
        props.setProperty("connectTimeout", "5");
        return DriverManager.getConnection(url, props);
    }

    // A TTL lease renewed on a connection of its own, trusted until a
    // deadline by the local monotonic clock: the time the last successful
    // acquire or renew was sent, plus the TTL, minus a margin.
    static class Lease {
        final String resource; final long token;
        volatile double deadline; volatile boolean lost;
        final ScheduledExecutorService renewer = Executors.newSingleThreadScheduledExecutor(r -> {
            var t = new Thread(r); t.setDaemon(true); return t;
        });
        Connection conn;

        Lease(String resource, long token, double sent) {
            this.resource = resource; this.token = token; this.deadline = sent + TTL - MARGIN;
            long every = (long) (TTL / 3 * 1000);
            renewer.scheduleWithFixedDelay(this::renew, every, every, TimeUnit.MILLISECONDS);
        }

        void renew() {
            if (lost) return;
            if (now() >= deadline) { lost = true; return; } // not renewed in time
            double sent = now();
            try {
                if (conn == null) conn = connect();
                try (var st = conn.prepareStatement("SELECT fence.renew(?, ?, make_interval(secs => ?))")) {
                    st.setString(1, resource); st.setLong(2, token); st.setDouble(3, TTL);
                    try (var rs = st.executeQuery()) {
                        rs.next();
                        if (rs.getTimestamp(1) == null) lost = true; // expired, released, revoked or superseded
                        else deadline = sent + TTL - MARGIN;
                    }
                }
            } catch (SQLException e) {
                try { if (conn != null) conn.close(); } catch (SQLException ignored) { }
                conn = null; // transient: retry on a new connection until the deadline
            }
        }

        boolean trusted() { return !lost && now() < deadline; }

        void stop() throws Exception {
            renewer.shutdown();
            renewer.awaitTermination(10, TimeUnit.SECONDS);
            if (conn != null) conn.close();
        }
    }

    record Job(long id, String payload, Lease lease) { }
    static final Job BUSY = new Job(0, null, null);

    // The first job that is not done and whose lease is not live, with its
    // lease; null when there is none; BUSY when the grant answered NULL.
    static Job claim(Connection conn) throws SQLException {
        conn.setAutoCommit(false);
        try {
            long id; String payload;
            try (var st = conn.createStatement(); var rs = st.executeQuery("""
                    SELECT id, payload FROM jobs j
                     WHERE NOT done
                       AND NOT EXISTS (SELECT FROM fence.leases l WHERE l.resource = 'job:' || j.id AND l.live)
                     ORDER BY id LIMIT 1
                       FOR UPDATE SKIP LOCKED""")) {
                if (!rs.next()) { conn.commit(); return null; }
                id = rs.getLong(1); payload = rs.getString(2);
            }
            double sent = now();
            try (var st = conn.prepareStatement("SELECT fence.acquire(?, ?, make_interval(secs => ?))")) {
                st.setString(1, "job:" + id); st.setString(2, worker); st.setDouble(3, TTL);
                try (var rs = st.executeQuery()) {
                    rs.next();
                    long token = rs.getLong(1);
                    boolean granted = !rs.wasNull();
                    conn.commit();
                    // NULL: a live lease holds job:N, or the grant waited fence.grant_wait (busy).
                    return granted ? new Job(id, payload, new Lease("job:" + id, token, sent)) : BUSY;
                }
            }
        } catch (SQLException e) {
            conn.rollback();
            throw e;
        } finally {
            conn.setAutoCommit(true);
        }
    }

    public static void main(String[] args) throws Exception {
        url = args[0]; worker = args[1];
        try (var conn = connect()) {
            for (int claimed = 0; MAX_JOBS == 0 || claimed < MAX_JOBS; ) {
                Job job = claim(conn);
                if (job == null) { System.out.println("idle"); break; }
                if (job == BUSY) { Thread.sleep(50); continue; }
                System.out.println("claimed " + job.id() + " token " + job.lease().token);
                claimed++;
                try {
                    String result = job.payload().toUpperCase(); // the work
                    if (!job.lease().trusted()) { System.out.println("lost " + job.id()); continue; }
                    if (System.getenv("PAUSE_BEFORE_WRITE") != null) // tests: a pause here is what the fence is for
                        new ProcessBuilder("kill", "-STOP", Long.toString(ProcessHandle.current().pid())).start().waitFor();
                    conn.setAutoCommit(false);
                    try (var up = conn.prepareStatement("""
                            INSERT INTO job_results (job_id, result, fence_token) VALUES (?, ?, ?)
                            ON CONFLICT (job_id) DO UPDATE SET result = excluded.result, fence_token = excluded.fence_token""");
                         var done = conn.prepareStatement("UPDATE jobs SET done = true WHERE id = ?")) {
                        up.setLong(1, job.id()); up.setString(2, result); up.setLong(3, job.lease().token);
                        up.executeUpdate();
                        done.setLong(1, job.id());
                        done.executeUpdate();
                        conn.commit();
                        System.out.println("done " + job.id());
                    } catch (SQLException e) {
                        conn.rollback();
                        // getSQLState() is the SQLSTATE. FN002 (no token) and FN003 (not granted
                        // for this resource) are bugs; FN001: a newer lease of job:N exists.
                        if (!"FN001".equals(e.getSQLState())) throw e;
                        var detail = e instanceof org.postgresql.util.PSQLException p && p.getServerErrorMessage() != null
                                ? p.getServerErrorMessage().getDetail() : "";
                        System.out.println("refused " + job.id() + " FN001 " + detail);
                    } finally {
                        conn.setAutoCommit(true);
                    }
                } finally {
                    job.lease().stop();
                    try (var st = conn.prepareStatement("SELECT fence.release(?, ?)")) {
                        st.setString(1, job.lease().resource); st.setLong(2, job.lease().token);
                        st.execute();
                    }
                }
            }
        }
    }
}
