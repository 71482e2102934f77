// A job-queue worker over pgfence with node-postgres (docs/clients.md).
//
// Usage: node worker.js DSN WORKER_NAME. Environment: TTL (seconds,
// default 2), MAX_JOBS (jobs to claim; 0: until the queue is empty).
'use strict';
const { Client } = require('pg');

const [DSN, WORKER] = process.argv.slice(2);
const TTL = Number(process.env.TTL || 2);
const MAX_JOBS = Number(process.env.MAX_JOBS || 0);
const MARGIN = TTL / 10; // stop side effects this long before the lease could pass on
const now = () => performance.now() / 1000; // monotonic seconds

// No `name` in any query: node-postgres then sends unnamed statements,
// which PgBouncer in transaction mode passes through.
const connect = async () => {
  const c = new Client({ connectionString: DSN, connectionTimeoutMillis: 5000 });
  await c.connect();
  return c;
};

// A TTL lease renewed on a connection of its own, trusted until a
// deadline by the local monotonic clock: the time the last successful
// acquire or renew was sent, plus the TTL, minus a margin.
class Lease {
  constructor(resource, token, sent) {
    Object.assign(this, { resource, token, deadline: sent + TTL - MARGIN, lost: false });
    this.timer = setInterval(() => this.renew(), (TTL / 3) * 1000);
  }
  renew() {
    if (this.inflight || this.lost || this.stopped) return;
    this.inflight = (async () => {
      const sent = now();
      try {
        this.conn = this.conn || (await connect());
        const r = await this.conn.query('SELECT fence.renew($1, $2, make_interval(secs => $3)) AS expires',
          [this.resource, this.token, TTL]);
        if (r.rows[0].expires === null) this.lost = true; // expired, released, revoked or superseded
        else this.deadline = sent + TTL - MARGIN;
      } catch (e) {
        if (this.conn) this.conn.end().catch(() => {});
        this.conn = null; // transient: retry on a new connection until the deadline
      }
    })().finally(() => { this.inflight = null; });
  }
  trusted() { return !this.lost && now() < this.deadline; }
  async stop() {
    this.stopped = true;
    clearInterval(this.timer);
    if (this.inflight) await this.inflight; // a renewal under way may be opening a connection
    if (this.conn) await this.conn.end().catch(() => {});
  }
}

// The first job that is not done and whose lease is not live, with its
// lease; null when there is none; 'busy' when the grant answered NULL.
async function claim(conn) {
  await conn.query('BEGIN');
  try {
    const r = await conn.query(`
      SELECT id, payload FROM jobs j
       WHERE NOT done
         AND NOT EXISTS (SELECT FROM fence.leases l WHERE l.resource = 'job:' || j.id AND l.live)
       ORDER BY id LIMIT 1
         FOR UPDATE SKIP LOCKED`);
    if (r.rows.length === 0) { await conn.query('COMMIT'); return null; }
    const { id, payload } = r.rows[0];
    const sent = now();
    const g = await conn.query('SELECT fence.acquire($1, $2, make_interval(secs => $3))::text AS token',
      [`job:${id}`, WORKER, TTL]);
    await conn.query('COMMIT');
    // NULL: a live lease holds job:N, or the grant waited fence.grant_wait (busy).
    if (g.rows[0].token === null) return 'busy';
    return { id, payload, lease: new Lease(`job:${id}`, g.rows[0].token, sent) };
  } catch (e) {
    await conn.query('ROLLBACK');
    throw e;
  }
}

async function main() {
  const conn = await connect();
  for (let claimed = 0; MAX_JOBS === 0 || claimed < MAX_JOBS;) {
    const job = await claim(conn);
    if (job === null) { console.log('idle'); break; }
    if (job === 'busy') { await new Promise((r) => setTimeout(r, 50)); continue; }
    const { id, payload, lease } = job;
    console.log(`claimed ${id} token ${lease.token}`);
    claimed++;
    try {
      const result = payload.toUpperCase(); // the work
      if (!lease.trusted()) { console.log(`lost ${id}`); continue; }
      if (process.env.PAUSE_BEFORE_WRITE) process.kill(process.pid, 'SIGSTOP'); // tests: a pause here is what the fence is for
      await conn.query('BEGIN');
      try {
        await conn.query(`INSERT INTO job_results (job_id, result, fence_token) VALUES ($1, $2, $3)
          ON CONFLICT (job_id) DO UPDATE SET result = excluded.result, fence_token = excluded.fence_token`,
        [id, result, lease.token]);
        await conn.query('UPDATE jobs SET done = true WHERE id = $1', [id]);
        await conn.query('COMMIT');
        console.log(`done ${id}`);
      } catch (e) {
        await conn.query('ROLLBACK');
        // e.code is the SQLSTATE. FN002 (no token) and FN003 (not granted
        // for this resource) are bugs; FN001: a newer lease of job:N exists.
        if (e.code !== 'FN001') throw e;
        console.log(`refused ${id} FN001 ${e.detail}`);
      }
    } finally {
      await lease.stop();
      await conn.query('SELECT fence.release($1, $2)', [lease.resource, lease.token]);
    }
  }
  await conn.end();
}

main().catch((e) => { console.error(e); process.exit(1); });
