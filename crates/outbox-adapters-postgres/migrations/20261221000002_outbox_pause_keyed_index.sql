-- Keyed claims while an exchange is paused (issue 47, after 20261221000001): the
-- claim walked every ordering key with an unsent row and passed over the heads
-- of a paused exchange's keys, one probe a key, so a paused exchange with many
-- keys cost every claim of every other exchange that many probes. While some
-- exchange is paused, the keys are walked per exchange not paused over this
-- index, which holds a key under each exchange it has a pending row of
-- (src/outbox/keys.rs, keyed_heads_by_exchange). The cost: a keyed row is
-- written to one more index at insert. On a large table in use, build it first
-- by hand (CREATE INDEX CONCURRENTLY IF NOT EXISTS with the same definition) and
-- this migration finds it.

SET LOCAL lock_timeout = '5s';

CREATE INDEX IF NOT EXISTS outbox_keyed_by_exchange ON outbox_messages (exchange, ordering_key, seq)
    WHERE status = 'pending' AND ordering_key IS NOT NULL;
