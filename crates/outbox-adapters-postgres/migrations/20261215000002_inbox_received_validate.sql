-- Validates the inbox's status CHECK added NOT VALID by 20261215000001: a scan of
-- the table under SHARE UPDATE EXCLUSIVE, which lets reads and writes go on.

ALTER TABLE outbox_inbox VALIDATE CONSTRAINT outbox_inbox_status_check;
