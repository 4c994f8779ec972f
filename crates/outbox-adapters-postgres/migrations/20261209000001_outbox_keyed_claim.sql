-- Claims take keyed rows by walking the keys over outbox_ordered (one probe per
-- key, never the rows queued behind a key's head), unkeyed rows by seq over
-- outbox_pending_unkeyed and unkeyed delayed ones by due time over
-- outbox_scheduled_unkeyed, which hold unkeyed rows only: a backlog of keyed rows
-- behind their heads, delayed or not, is then never scanned by a claim.
-- outbox_pending_unkeyed replaces outbox_pending_now (pending, no due time, keyed
-- or not), so an immediate pending row is still written to one claim index; a
-- delayed unkeyed row is written to outbox_scheduled (the relay's timer reads it
-- for every delayed row) and outbox_scheduled_unkeyed. On a large table in use,
-- build the new indexes first by hand (CREATE INDEX CONCURRENTLY IF NOT EXISTS with
-- the same definitions) and this migration finds them.

SET LOCAL lock_timeout = '5s';

CREATE INDEX IF NOT EXISTS outbox_pending_unkeyed ON outbox_messages (seq)
    WHERE status = 'pending' AND not_before IS NULL AND ordering_key IS NULL;

CREATE INDEX IF NOT EXISTS outbox_scheduled_unkeyed ON outbox_messages (not_before, seq)
    WHERE status = 'pending' AND not_before IS NOT NULL AND ordering_key IS NULL;

DROP INDEX IF EXISTS outbox_pending_now;
