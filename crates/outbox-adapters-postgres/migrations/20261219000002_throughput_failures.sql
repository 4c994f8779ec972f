-- The overview chart's failures series (issue 36): failed publish and handler
-- attempts per minute, added by relays and consumers as their other totals are.
-- The table holds at most a day of minutes, so re-checking the constraint reads
-- a few thousand rows at most.
SET LOCAL lock_timeout = '5s';
ALTER TABLE outbox_throughput DROP CONSTRAINT IF EXISTS outbox_throughput_kind_check;
ALTER TABLE outbox_throughput ADD CONSTRAINT outbox_throughput_kind_check
    CHECK (kind IN ('published', 'consumed', 'publish_failed', 'consume_failed'));
