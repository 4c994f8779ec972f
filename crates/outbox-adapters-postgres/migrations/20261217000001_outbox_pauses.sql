-- Pauses set by operators (issue 35): an exchange whose messages the relays hold
-- pending, a consumer whose workers take no deliveries. Every claim reads this
-- table (an init plan of a few rows, read once per statement), so every relay of
-- the schema obeys a pause at its next claim and a restart keeps it.
CREATE TABLE IF NOT EXISTS outbox_pauses (
    kind      text        NOT NULL CHECK (kind IN ('exchange', 'consumer')),
    name      text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 255),
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text        NOT NULL,
    PRIMARY KEY (kind, name)
);
