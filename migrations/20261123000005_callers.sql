-- Callers. A send belongs to the client that created it: `client` is the
-- authenticated client's name ("local" while authentication is off, '' for
-- sends created before clients existed). Idempotency keys are per client.
-- Expand-only: code from before this migration keeps working against it.
ALTER TABLE messages
    ADD COLUMN client VARCHAR(64) NOT NULL DEFAULT '' AFTER message_id,
    ADD KEY idx_messages_client_sender (client, sender, message_id);

ALTER TABLE idempotency_keys
    ADD COLUMN client VARCHAR(64) NOT NULL DEFAULT '' FIRST,
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (client, sender, idempotency_key);

-- Lifecycle and admin actions: who did what to which send or group, when,
-- and how it ended. A record lives on its target's home shard (a client's
-- own actions without a target on the shard of the client's name), so the
-- history of one send is one indexed range on one shard.
CREATE TABLE IF NOT EXISTS audit_log (
    audit_id    BIGINT UNSIGNED NOT NULL COMMENT 'time-ordered, from the message id generator',
    at          DATETIME(3)     NOT NULL,
    client      VARCHAR(64)     NOT NULL,
    action      VARCHAR(64)     NOT NULL,
    target_kind VARCHAR(16)     NOT NULL DEFAULT '' COMMENT 'message, group or empty',
    target_id   BIGINT UNSIGNED NOT NULL DEFAULT 0,
    outcome     VARCHAR(32)     NOT NULL COMMENT 'ok, or the gRPC code of the failure',
    detail      VARCHAR(512)    NOT NULL DEFAULT '',
    PRIMARY KEY (audit_id),
    KEY idx_audit_target (target_kind, target_id, audit_id),
    KEY idx_audit_client (client, audit_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
