-- A chunk's first user in the recipients' index (expand only): the index
-- entries a recipients query reads already say where each chunk's run of
-- users ends; with where it starts too, GetRecipientStatus tests a user
-- only against the one chunk of a batch whose range holds them, instead of
-- against the first chunk of every later batch (a send appended in many
-- batches of ascending ids paired each user with most of them), and a page
-- skips chunks that start past what it can list without reading them.
--
-- The same name and the same leading columns: a version that reads the old
-- index (FORCE INDEX idx_chunks_recipients) reads this one unchanged during
-- a rollout. One entry per chunk (500 recipients), so the rebuild is small
-- and runs in place, without locking the table.
ALTER TABLE message_chunks
    DROP KEY idx_chunks_recipients,
    ADD KEY idx_chunks_recipients (message_id, state, batch, last_user, first_user),
    ALGORITHM=INPLACE, LOCK=NONE;
