-- "Who read it" without an item lookup per reader: a recorded read keeps
-- when its item was delivered (the item's created_at, which never changes
-- once written), set by the statement that records the read. A page of a
-- send's readers is then a range of message_reads' primary key alone: the
-- page looked each reader's item up by key for that time (and to check it
-- was still read), and on a shard whose items outgrow the buffer pool those
-- lookups were most of the page (15 ms of a shard's 328 readers in the 1M
-- recipients benchmark).
--
-- Expand: added instantly (no copy of the table); old pods name their
-- columns and leave it NULL. New pods look a reader's item up only for a
-- row that has none (a read recorded by an older pod, or before this).
-- Nothing to backfill or contract.
ALTER TABLE message_reads
    ADD COLUMN delivered_at DATETIME(3) NULL,
    ALGORITHM=INSTANT;
