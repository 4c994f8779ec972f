-- Per-key ordering: `ordering_key` (NULL: no order). A keyed message is claimed
-- only while no earlier message of its key is still unsent (pending, in flight,
-- delayed, failed and waiting for its retry, or dead unless the relay skips dead
-- ones): outbox_ordered answers "is there an earlier one" with one index probe.
-- A nullable column without a default is a catalog change; on a large table in
-- use, add the column and build the index first by hand (ALTER TABLE ... ADD COLUMN
-- IF NOT EXISTS ordering_key text; then CREATE INDEX CONCURRENTLY IF NOT EXISTS
-- with the same definition) and this migration finds them.

SET LOCAL lock_timeout = '5s';

ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS ordering_key text;

-- Carried like the other AMQP short strings: at most 255 bytes. Every existing row
-- has NULL here, so NOT VALID skips nothing.
ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_ordering_key_amqp
    CHECK (ordering_key IS NULL OR octet_length(ordering_key) <= 255)
    NOT VALID;

-- Keyed unsent rows only: messages without a key pay nothing for it.
CREATE INDEX IF NOT EXISTS outbox_ordered ON outbox_messages (ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND status IN ('pending', 'publish_failed', 'dead');
