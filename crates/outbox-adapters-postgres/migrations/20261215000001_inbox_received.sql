-- The inbox's status for a delivery received and not yet handled is 'received'.
-- It was 'sent', which on the outbox side means confirmed by the broker: one word,
-- two meanings. The outbox's statuses do not change.
--
-- Stop the consumers for this migration (the relay may keep running): a consumer
-- of the release before writes 'sent', which the new CHECK refuses, and looks for
-- its rows as 'sent', which it no longer finds. Nothing is lost either way (a
-- refused delivery is returned to the broker and comes again), but nothing moves
-- until the consumers run this release.
--
-- On a large inbox in use, build the three new indexes first by hand, concurrently
-- (CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_due_received ... with the
-- definitions below); this migration then finds them, and holds its lock only for
-- the rows in progress it rewrites (few: those not yet handled) and the renames.
-- The CHECK is added NOT VALID here (no scan under the lock: every row this
-- migration leaves is valid, as it rewrote the 'sent' ones) and validated by the
-- next migration, under a lock that lets reads and writes go on.
--
-- Going back to a release before this one: stop the consumers, then
--   ALTER TABLE outbox_inbox DROP CONSTRAINT outbox_inbox_status_check;
--   UPDATE outbox_inbox SET status = 'sent' WHERE status = 'received';
--   ALTER TABLE outbox_inbox ADD CONSTRAINT outbox_inbox_status_check
--       CHECK (status IN ('sent', 'consumed', 'consume_failed', 'dead'));
--   ALTER TABLE outbox_inbox ALTER COLUMN status SET DEFAULT 'sent';
-- build inbox_due, inbox_ordered and inbox_held again as 20261130000001,
-- 20261208000001 and 20261210000001 define them (on 'sent'), and
--   DELETE FROM _sqlx_migrations WHERE version IN (20261215000001, 20261215000002);
-- (the older release refuses to start on a migration it does not know).

SET LOCAL lock_timeout = '5s';

CREATE INDEX IF NOT EXISTS inbox_due_received ON outbox_inbox (consumer, next_attempt_at, seq)
    WHERE status IN ('received', 'consume_failed');
CREATE INDEX IF NOT EXISTS inbox_ordered_received ON outbox_inbox (consumer, ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND status IN ('received', 'consume_failed');
CREATE INDEX IF NOT EXISTS inbox_held_received ON outbox_inbox (consumer, ordering_key, seq)
    WHERE status = 'received' AND next_attempt_at IS NULL AND ordering_key IS NOT NULL;

ALTER TABLE outbox_inbox DROP CONSTRAINT IF EXISTS outbox_inbox_status_check;
ALTER TABLE outbox_inbox ADD CONSTRAINT outbox_inbox_status_check
    CHECK (status IN ('received', 'consumed', 'consume_failed', 'dead')) NOT VALID;
ALTER TABLE outbox_inbox ALTER COLUMN status SET DEFAULT 'received';

-- Found through the old inbox_due (the rows in progress and failed ones).
UPDATE outbox_inbox SET status = 'received' WHERE status = 'sent';

-- An index a failed CREATE INDEX CONCURRENTLY left INVALID has the name but not
-- the content: refuse it rather than rename it into place (claims would scan).
DO $$
DECLARE
    bad text;
BEGIN
    SELECT string_agg(c.relname::text, ', ') INTO bad
      FROM pg_index i
      JOIN pg_class c ON c.oid = i.indexrelid
     WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
       AND c.relname IN ('inbox_due_received', 'inbox_ordered_received', 'inbox_held_received')
       AND NOT (i.indisvalid AND i.indisready);
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'index % is not valid (left by a CREATE INDEX CONCURRENTLY that failed?): drop it and migrate again', bad;
    END IF;
END $$;

DROP INDEX IF EXISTS inbox_due;
DROP INDEX IF EXISTS inbox_ordered;
DROP INDEX IF EXISTS inbox_held;
ALTER INDEX inbox_due_received RENAME TO inbox_due;
ALTER INDEX inbox_ordered_received RENAME TO inbox_ordered;
ALTER INDEX inbox_held_received RENAME TO inbox_held;
