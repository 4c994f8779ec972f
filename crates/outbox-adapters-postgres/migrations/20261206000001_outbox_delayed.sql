-- Delayed messages: `not_before` is a pending message's due time (NULL: at once).
-- The relay's claim reads two partial indexes, so its cost follows the due rows,
-- never the delayed ones still waiting: outbox_pending_now (pending, no due time,
-- by seq) and outbox_scheduled (pending with a due time, by due time; also the
-- relay's timer for the next one). outbox_pending (every pending row by seq) stays
-- for the operator's pages and counts of pending messages, delayed ones included;
-- what the extra index entry costs an insert is for the benchmarks to say.
--
-- On a large table in use, build the two indexes first, by hand and without
-- blocking producers (this migration then finds them):
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_pending_now ON <schema>.outbox_messages (seq)
--     WHERE status = 'pending' AND not_before IS NULL;   -- after adding the column
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_scheduled ON <schema>.outbox_messages (not_before, seq)
--     WHERE status = 'pending' AND not_before IS NOT NULL;
-- Adding a nullable column without a default is a catalog change only.

SET LOCAL lock_timeout = '5s';

ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS not_before timestamptz;

-- Readable by the relay (as created_at): finite, before the year 10000. Every
-- existing row has NULL here, so NOT VALID skips nothing.
ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_not_before_readable
    CHECK (not_before IS NULL OR (isfinite(not_before) AND not_before < '10000-01-01 00:00:00+00'))
    NOT VALID;

CREATE INDEX IF NOT EXISTS outbox_pending_now ON outbox_messages (seq)
    WHERE status = 'pending' AND not_before IS NULL;
CREATE INDEX IF NOT EXISTS outbox_scheduled ON outbox_messages (not_before, seq)
    WHERE status = 'pending' AND not_before IS NOT NULL;
