-- pgfence from psql (docs/clients.md): a holder pauses past its TTL, a
-- newer holder writes, the old one's write is refused.
\set ON_ERROR_STOP off
SELECT fence.acquire('job:1', 'psql-A', '2 seconds') AS token_a \gset
\echo A holds job:1 with token :token_a
SELECT fence.acquire('job:1', 'psql-C', '30 seconds') IS NULL AS held_by_a \gset
\echo C is refused while A holds it (NULL: :held_by_a)
SELECT pg_sleep(2.5) \g /dev/null
SELECT fence.acquire('job:1', 'psql-B', '30 seconds') AS token_b \gset
\echo B holds job:1 with token :token_b
INSERT INTO job_results (job_id, result, fence_token) VALUES (1, 'by B', :token_b)
    ON CONFLICT (job_id) DO UPDATE SET result = excluded.result, fence_token = excluded.fence_token;
-- A wakes up and writes under its old token:
INSERT INTO job_results (job_id, result, fence_token) VALUES (1, 'by A', :token_a)
    ON CONFLICT (job_id) DO UPDATE SET result = excluded.result, fence_token = excluded.fence_token;
\if :ERROR
\echo A was refused: :LAST_ERROR_SQLSTATE
\endif
SELECT fence.release('job:1', :token_b) AS released \gset
\echo B released job:1: :released
