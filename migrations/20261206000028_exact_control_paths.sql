-- A control operation on a send (cancel, recall, edit), recorded on the
-- send's home shard in the same transaction as the status or content change
-- it stands for: the durable intent that the caller's api, then any
-- worker's sweeper, drives to the end on every shard, whatever fails midway.
-- The row goes once every shard's part is done.
--
-- `generation` grows when the operation is asked for again (an edit after
-- an edit) and `shards_done` lists the shards whose visible part (a content
-- copy revoked or edited, its recipients' cached badges and pages retired)
-- is done for that generation. `retire` says which cached badges and pages
-- the operation retires: 0 none (nothing delivered yet), 1 the recipients'
-- (per chunk, read from the send's chunks on each shard), 2 every user's
-- (the announcement epoch: an announcement, or a send over
-- `control.retire_recipients_max`). A drive holds `leased_until` (renewed as
-- it goes, under `lease_token`); the sweeper takes operations whose lease
-- ran out.
CREATE TABLE IF NOT EXISTS message_operations (
    message_id   BIGINT UNSIGNED  NOT NULL,
    kind         TINYINT UNSIGNED NOT NULL COMMENT '1 cancel, 2 recall, 3 edit',
    generation   INT UNSIGNED     NOT NULL DEFAULT 1,
    retire       TINYINT UNSIGNED NOT NULL DEFAULT 0,
    shards_done  VARCHAR(1024)    NOT NULL DEFAULT '',
    leased_until DATETIME(3)      NOT NULL,
    lease_token  BIGINT UNSIGNED  NOT NULL DEFAULT 0,
    attempts     INT UNSIGNED     NOT NULL DEFAULT 0,
    last_error   VARCHAR(255)     NOT NULL DEFAULT '',
    created_at   DATETIME(3)      NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (message_id, kind),
    KEY idx_operations_due (leased_until)
) ENGINE=InnoDB;

-- Edits in order: the home record counts them, and a shard's content copy
-- takes an edit only if it is newer than the one it holds, so two edits
-- driven at once (the caller's api and a sweeper) leave every copy with the
-- last.
ALTER TABLE messages ADD COLUMN IF NOT EXISTS content_version INT UNSIGNED NOT NULL DEFAULT 0;
ALTER TABLE message_contents ADD COLUMN IF NOT EXISTS content_version INT UNSIGNED NOT NULL DEFAULT 0;

-- Users whose cached badge, inbox pages and group cursors a write could not
-- retire because Redis did not answer: written in the write's transaction
-- (an item update, an announcement's materialization, a preference change,
-- a group ack), so the write succeeds with Redis away, and every worker's
-- settler retires the user's cached state once Redis answers again, then
-- deletes the row (unless a later write stamped it again since).
CREATE TABLE IF NOT EXISTS badge_repairs (
    user_id    BIGINT UNSIGNED NOT NULL,
    changed_at DATETIME(6)     NOT NULL,
    PRIMARY KEY (user_id)
) ENGINE=InnoDB;

-- Gateway events recorded in the transaction of the change they report
-- (an item update, a preference change, a group ack, send, recall or
-- member change, an erasure, an announcement's start), on the shard of
-- that transaction: the api that made the change publishes it after the
-- commit and deletes the row; a row left (the publish failed, the api died
-- first) is published by every worker's relay. `body` is a `BusEvent`
-- (JSON) that tells every gateway what to refresh.
CREATE TABLE IF NOT EXISTS event_outbox (
    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    body       BLOB            NOT NULL,
    created_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (id)
) ENGINE=InnoDB;
