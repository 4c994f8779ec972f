-- The consumer's batched inbox transaction records all its deliveries' rows in one
-- INSERT before the first handler runs. A handler that ended that transaction with
-- a COMMIT of its own would commit the rows of the deliveries whose handlers have
-- not run yet, as consumed: those messages would be lost. So while a batch is open
-- (the consumer sets `outbox.inbox_batch` to 'open' for its transaction), every
-- consumed row it inserts queues this check, and the COMMIT is refused unless the
-- consumer itself sealed the batch ('sealed', set right before its own COMMIT).
--
-- Rows inserted outside a batch (the single-delivery path, older releases) do not
-- match the WHEN condition and cost nothing. Back out by dropping the trigger and
-- the function, and then
--   DELETE FROM _sqlx_migrations WHERE version = 20261216000001;
-- (a consumer of this release then records batches unguarded: stop it first).

-- A handler that runs SET CONSTRAINTS ALL IMMEDIATE in a batch fires these checks
-- before the seal: its attempt fails with this error and is retried in a
-- transaction of its own, where no check is queued.
--
-- The trigger takes a lock that waits for inbox transactions in flight: not longer
-- than 5 s (migrate again if it timed out).
SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE FUNCTION outbox_inbox_batch_sealed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('outbox.inbox_batch', true) IS DISTINCT FROM 'sealed' THEN
        RAISE EXCEPTION 'outbox: the inbox transaction of a batch can only be committed by the consumer'
            USING HINT = 'A handler ended the transaction it was given (a COMMIT of its own); '
                         'the batch is rolled back and its deliveries handled one by one.';
    END IF;
    RETURN NULL;
END
$$;

-- The consumer's seal: refused unless the transaction is still the one the batch's
-- rows were inserted in (a handler may have ended it, its COMMIT refused, and begun
-- another); a function, so PostgreSQL compiles it once a session, not once a batch.
CREATE OR REPLACE FUNCTION outbox_inbox_batch_seal(batch_xid xid8) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_current_xact_id() IS DISTINCT FROM batch_xid THEN
        RAISE EXCEPTION 'outbox: the inbox batch''s transaction was ended by a handler and another begun';
    END IF;
    PERFORM set_config('outbox.inbox_batch', 'sealed', true);
END
$$;

-- A constraint trigger has no CREATE OR REPLACE: dropped first, so the migration
-- can run again.
DROP TRIGGER IF EXISTS inbox_batch_sealed ON outbox_inbox;
CREATE CONSTRAINT TRIGGER inbox_batch_sealed AFTER INSERT ON outbox_inbox
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.status = 'consumed' AND current_setting('outbox.inbox_batch', true) = 'open')
    EXECUTE FUNCTION outbox_inbox_batch_sealed();
