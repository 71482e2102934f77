-- The queue: producers insert here, with no lease and no token.
CREATE TABLE jobs (
    id      bigserial PRIMARY KEY,
    payload text NOT NULL,
    done    boolean NOT NULL DEFAULT false
);
-- The results: one resource per row, job:<job_id>; only the worker that
-- holds job:N may write row N, with its token.
CREATE TABLE job_results (
    job_id      bigint PRIMARY KEY REFERENCES jobs,
    result      text NOT NULL,
    fence_token bigint NOT NULL
);
SELECT fence.protect_rows('job_results', 'job_id', 'job:', 'fence_token');
-- A producer:
INSERT INTO jobs (payload) VALUES ('first'), ('second');
