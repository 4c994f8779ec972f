-- With dead heads skipped (`ordering.on_dead = "skip"`), a claim's key walk and
-- head probes look for pending and failing rows only. Over outbox_ordered, which
-- holds dead keyed rows too (blocking relays need them), each probe stepped over
-- every dead row of the keys it passed (a heap read each, since status is not in
-- the index), so claims slowed as dead rows piled up. outbox_ordered_live holds
-- keyed rows in those two statuses only; the planner takes it exactly when the
-- statement asks for no dead rows. The cost: one more index entry for each keyed
-- row version while pending or failing. On a large table in use, build it first
-- by hand (CREATE INDEX CONCURRENTLY IF NOT EXISTS with the same definition) and
-- this migration finds it.

SET LOCAL lock_timeout = '5s';

CREATE INDEX IF NOT EXISTS outbox_ordered_live ON outbox_messages (ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND status IN ('pending', 'publish_failed');
