-- Webhook outbox (expand only): a send's webhook event (message.completed,
-- message.recalled, message.failed) is recorded in the transaction of the
-- change it reports, on the shard that change is on, when some endpoint
-- asked for it. The process that made the change queues it in RabbitMQ
-- right after the commit and deletes the row; a row still here at due_at
-- (that publish failed, or the process died in between) is queued by a
-- worker's relay, which first moves due_at on by a lease so that two
-- workers do not take it at once. So an event is queued at least once
-- whatever fails after its change committed.
--
-- event_key: 16 random bytes; every webhook-id of the event derives from
--   it and the endpoint's url, so an event queued twice (by its process and
--   by the relay) reaches an endpoint under one id, which receivers dedupe.
-- created_at: when the change was made (the payload's timestamp).
-- attempts: how many times the relay took the row.
--
-- Rows live seconds (minutes while RabbitMQ is away); a new table, no
-- existing one changes, so an older version running beside this one during
-- a rollout just never writes here.
CREATE TABLE IF NOT EXISTS webhook_outbox (
    event_key  BINARY(16)          NOT NULL,
    message_id BIGINT UNSIGNED     NOT NULL,
    event      VARCHAR(32)         CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    chunk_id   BIGINT UNSIGNED     NULL,
    created_at DATETIME(3)         NOT NULL,
    due_at     DATETIME(3)         NOT NULL,
    attempts   INT UNSIGNED        NOT NULL DEFAULT 0,
    PRIMARY KEY (event_key),
    KEY idx_webhook_outbox_due (due_at)
) ENGINE=InnoDB;
