-- The dashboard's sessions (issue 35), so that a restart of `outbox run` or a
-- second instance behind a load balancer keeps operators signed in. The columns
-- are those tower-sessions' PostgreSQL store reads and writes; `id` is a hash of
-- the cookie's secret, never the secret itself, so reading this table opens no
-- session. Expired rows are deleted by the instances serving the dashboard.
CREATE TABLE IF NOT EXISTS outbox_ui_sessions (
    id          text        PRIMARY KEY NOT NULL,
    data        bytea       NOT NULL,
    expiry_date timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_ui_sessions_expiry ON outbox_ui_sessions (expiry_date);
