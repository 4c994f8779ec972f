-- What was done to one message or delivery (issue 49: its page shows the
-- operators' actions among its attempts): the audit log read by target. The log
-- is small beside the tables (one row per operator write, a bulk action is one
-- row), so the index is built here.
SET LOCAL lock_timeout = '5s';

CREATE INDEX IF NOT EXISTS outbox_audit_target ON outbox_audit (target, seq);
