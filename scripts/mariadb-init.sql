-- Notify's MariaDB account. Idempotent: run by scripts/lib.sh on every
-- bring-up and by the mariadb container on first start (docker-compose.yml).
-- The service uses one database per shard and the tests create and drop
-- throw-away `notify_t<random>_<n>` databases, so the grant covers every
-- database whose name starts with "notify" (`%` is a wildcard in GRANT).
CREATE USER IF NOT EXISTS 'notify'@'localhost' IDENTIFIED BY 'notify';
CREATE USER IF NOT EXISTS 'notify'@'127.0.0.1' IDENTIFIED BY 'notify';
CREATE USER IF NOT EXISTS 'notify'@'%' IDENTIFIED BY 'notify';
GRANT ALL PRIVILEGES ON `notify%`.* TO 'notify'@'localhost';
GRANT ALL PRIVILEGES ON `notify%`.* TO 'notify'@'127.0.0.1';
GRANT ALL PRIVILEGES ON `notify%`.* TO 'notify'@'%';
-- The fault tests read the server's transactions (information_schema.
-- INNODB_TRX) to pick the connections they kill; a connection of the same
-- account is killed without more.
GRANT PROCESS ON *.* TO 'notify'@'localhost';
GRANT PROCESS ON *.* TO 'notify'@'127.0.0.1';
GRANT PROCESS ON *.* TO 'notify'@'%';
