"""Test helper (not quoted in docs/clients.md): THREADS threads, each with
its own psycopg connection, run CALLS parameterized queries; prints the
number of errors by SQLSTATE. With the argument "none" the connections use
prepare_threshold=None; else psycopg's default (prepare after 5 runs)."""
import collections
import sys
import threading

import psycopg

DSN, MODE = sys.argv[1], sys.argv[2]
THREADS, CALLS = 6, 60
errors = collections.Counter()
lock = threading.Lock()


def run():
    kw = {"prepare_threshold": None} if MODE == "none" else {}
    with psycopg.connect(DSN, autocommit=True, **kw) as conn:
        for i in range(CALLS):
            try:
                conn.execute("SELECT fence.lock_key(%s)", (f"k{i % 3}",)).fetchone()
            except psycopg.Error as e:
                with lock:
                    errors[e.sqlstate] += 1


ts = [threading.Thread(target=run) for _ in range(THREADS)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(sum(errors.values()), dict(errors))
