-- Prototype measured for issue 20, not shipped (docs/benchmarks.md): the per-row
-- guard checked in its row trigger, the statement triggers dropped; past 64
-- gates a row lock through a SECURITY DEFINER SQL function. Applies over 008
-- to the table pr of the instructions tool (protect_rows(pr, id, row:, tok));
-- covers UPDATE and INSERT of the token column only (no moves, no DELETE,
-- no REPEATABLE READ). Measured with a copy of ../shared/tools/instructions.sh
-- that runs psql -1 -f on this file after its fixture: one row 225 253
-- instructions (0.602), the 10 000-row statement 829.4 M (0.151).
DROP TRIGGER "~fence_rows_2_ins" ON pr;
DROP TRIGGER "~fence_rows_2_upd" ON pr;
DROP TRIGGER "~fence_rows_2_del" ON pr;
DROP TRIGGER "~fence_rows_3_pin" ON pr;
CREATE FUNCTION fence._lock_check(res text, tok bigint) RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
AS $$ SELECT x.token OPERATOR(pg_catalog.=) tok FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res FOR KEY SHARE $$;
CREATE OR REPLACE FUNCTION fence._rows_de3fc91f74b5e6769b811a7bdac79869() RETURNS trigger
LANGUAGE plpgsql AS $f$
DECLARE
    res pg_catalog.text;
    tok pg_catalog.int8;
    held pg_catalog.int4;
    ok pg_catalog.bool;
BEGIN
    IF TG_NAME OPERATOR(pg_catalog.=) '~fence_guard_0_mark' THEN
        IF NEW.tok OPERATOR(pg_catalog.=) OLD.tok AND pg_catalog.pg_trigger_depth() OPERATOR(pg_catalog.>) 1 THEN
            RETURN NEW;
        END IF;
        IF NEW.tok OPERATOR(pg_catalog.<=) 0 THEN
            PERFORM fence.check((TG_ARGV[0] OPERATOR(pg_catalog.||) NEW.id::pg_catalog.text) COLLATE pg_catalog."C", NEW.tok);
        END IF;
        NEW.tok := OPERATOR(pg_catalog.-) NEW.tok;
        RETURN NEW;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' AND NEW.tok OPERATOR(pg_catalog.<) 0
       AND (OLD.tok IS NULL OR NEW.tok OPERATOR(pg_catalog.<>) OLD.tok) THEN
        tok := OPERATOR(pg_catalog.-) NEW.tok;
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        tok := NEW.tok;
    END IF;
    res := (TG_ARGV[0] OPERATOR(pg_catalog.||) NEW.id::pg_catalog.text) COLLATE pg_catalog."C";
    IF tok IS NULL THEN
        tok := fence._registered_token(res, TG_OP, TG_RELID);
    END IF;
    held := CASE WHEN pg_catalog.current_setting('fence._gates', true) OPERATOR(pg_catalog.~) '^[0-9]{1,4}$'
                 THEN pg_catalog.current_setting('fence._gates', true)::pg_catalog.int4 ELSE 0 END;
    IF held OPERATOR(pg_catalog.<) 64 AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        BEGIN
            ok := pg_catalog.pg_try_advisory_xact_lock_shared(fence._gate_key(res));
        EXCEPTION WHEN OTHERS THEN
            RAISE;
        END;
        IF ok THEN
            ok := pg_catalog.set_config('fence._gates', (held OPERATOR(pg_catalog.+) 1)::pg_catalog.text, true) IS NOT NULL;
            SELECT x.token OPERATOR(pg_catalog.=) tok AND CURRENT_USER OPERATOR(pg_catalog.=) fence._acting_role()
              INTO ok FROM fence.lease x WHERE x.resource OPERATOR(pg_catalog.=) res;
        END IF;
    ELSE
        ok := fence._lock_check(res, tok);
    END IF;
    IF ok IS NOT TRUE THEN
        PERFORM fence.check(res, tok);
    END IF;
    NEW.tok := tok;
    RETURN NEW;
END
$f$;
