-- Per-key order on the consume side: a consumer that keeps order by key
-- (ConsumerConfig::ordered_by_key) stores the delivery's ordering key here (NULL:
-- no order, and every consumer that does not keep order stores NULL). A keyed row
-- is handled only while no earlier row of its consumer and key is unfinished
-- ('sent' or 'consume_failed'); inbox_ordered answers "is there an earlier one"
-- with one index probe. Dead rows do not hold their key back.
-- A nullable column without a default is a catalog change; on a large inbox in use,
-- add the column and build the index first by hand (ALTER TABLE ... ADD COLUMN IF
-- NOT EXISTS ordering_key text; then CREATE INDEX CONCURRENTLY IF NOT EXISTS with
-- the same definition) and this migration finds them.

SET LOCAL lock_timeout = '5s';

ALTER TABLE outbox_inbox ADD COLUMN IF NOT EXISTS ordering_key text;

CREATE INDEX IF NOT EXISTS inbox_ordered ON outbox_inbox (consumer, ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND status IN ('sent', 'consume_failed');
