-- Claims take keyed rows by walking the keys over outbox_ordered (one probe per
-- key, never the rows queued behind a key's head), and unkeyed rows by seq over
-- this index, which holds unkeyed rows only: a backlog of keyed rows behind their
-- heads is then never scanned by a claim. It replaces outbox_pending_now (pending,
-- no due time, keyed or not), so each pending row is still written to one claim
-- index. On a large table in use, build the new index first by hand (CREATE INDEX
-- CONCURRENTLY IF NOT EXISTS with the same definition) and this migration finds it.

SET LOCAL lock_timeout = '5s';

CREATE INDEX IF NOT EXISTS outbox_pending_unkeyed ON outbox_messages (seq)
    WHERE status = 'pending' AND not_before IS NULL AND ordering_key IS NULL;

DROP INDEX IF EXISTS outbox_pending_now;
