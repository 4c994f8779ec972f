-- Inbox retention deletes one consumer's rows consumed before a cut-off, oldest
-- first: this index serves it, so its cost follows the rows it deletes, not the
-- other consumers' rows nor its own recent ones (tests/retention_scale.rs checks
-- the plan). inbox_consumed_at (consumed_at) stays: the operator's consumed-per-minute
-- figure counts across all consumers by time.
CREATE INDEX inbox_retention ON outbox_inbox (consumer, consumed_at) WHERE status = 'consumed';
