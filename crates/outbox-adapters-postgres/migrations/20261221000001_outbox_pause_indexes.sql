-- Claims while an exchange is paused (issue 47): each claim's pick walks its
-- partial index in order and passed over a paused exchange's rows where it met
-- them, so a paused backlog at the front was read by every claim of every other
-- exchange (100,000 paused rows: about 23 ms a claim, and the same for the idle
-- relay's work check that each commit into the paused exchange started). While
-- some exchange is paused, the picks walk the exchanges over these indexes, one
-- probe each, and read only the exchanges not paused (src/outbox/paused.rs).
-- Each has the predicate of the pick's own index with the exchange in front.
-- The cost: an immediate or delayed unkeyed row is written to one more index at
-- insert, a failed row at its failure. On a large table in use, build them first
-- by hand (CREATE INDEX CONCURRENTLY IF NOT EXISTS with the same definitions) and
-- this migration finds them.

SET LOCAL lock_timeout = '5s';

CREATE INDEX IF NOT EXISTS outbox_pending_by_exchange ON outbox_messages (exchange, seq)
    WHERE status = 'pending' AND not_before IS NULL AND ordering_key IS NULL;

CREATE INDEX IF NOT EXISTS outbox_scheduled_by_exchange ON outbox_messages (exchange, not_before, seq)
    WHERE status = 'pending' AND not_before IS NOT NULL AND ordering_key IS NULL;

CREATE INDEX IF NOT EXISTS outbox_retry_by_exchange ON outbox_messages (exchange, next_attempt_at, seq)
    WHERE status = 'publish_failed';
