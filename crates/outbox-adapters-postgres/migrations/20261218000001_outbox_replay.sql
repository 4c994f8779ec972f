-- Edit and replay (issue 35): a dead message or delivery an operator edited and
-- sent again as a new one. The replay names its original (replayed_from); the
-- original stays dead and names its replay (replayed_as), which the requeue and
-- reconsume statements check, so that it never runs a second time beside it.
-- Nullable columns without a default: adding them rewrites nothing, and the
-- tables' lock is waited for at most lock_timeout (a long transaction in the way
-- fails the migration instead of holding every producer behind it).
SET LOCAL lock_timeout = '5s';
ALTER TABLE outbox_messages
    ADD COLUMN IF NOT EXISTS replayed_from uuid,
    ADD COLUMN IF NOT EXISTS replayed_as uuid;
ALTER TABLE outbox_inbox
    ADD COLUMN IF NOT EXISTS replayed_from uuid,
    ADD COLUMN IF NOT EXISTS replayed_as uuid;
