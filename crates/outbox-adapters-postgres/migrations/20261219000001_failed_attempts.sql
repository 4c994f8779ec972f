-- Attempt history (issue 36): each row keeps its last failed attempts (attempt
-- number, time, error; at most outbox_core::FAILED_ATTEMPTS_KEPT, oldest first)
-- as a JSON array, written by the same statement that marks the failure. On the
-- row itself, so it is pruned with the row and costs nothing for a message that
-- never failed (NULL).
-- Nullable without a default: adding it rewrites nothing; the tables' lock is
-- waited for at most lock_timeout.
SET LOCAL lock_timeout = '5s';
ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS failed_attempts jsonb;
ALTER TABLE outbox_inbox ADD COLUMN IF NOT EXISTS failed_attempts jsonb;
