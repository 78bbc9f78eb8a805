-- A user's language (Preferences.locale): a BCP 47 tag in its canonical
-- form, '' when not set. An expand step only: a build before it neither
-- reads nor writes the column (its writes name their own columns), so no
-- contract migration follows.
ALTER TABLE user_preferences
    ADD COLUMN IF NOT EXISTS locale VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '';
