-- What only schema versions older than this binary's need (versions.rs): run by the first
-- gateway start that finds no older host alive, under the schema lock, once per version.
-- Version 2: the signatures replaced before versions were recorded (no release since
-- calls them; from now on a replaced one waits here until no host that calls it is alive).
DROP FUNCTION IF EXISTS hb_win(bigint, integer, bigint, bigint, bigint, text, jsonb);
DROP FUNCTION IF EXISTS hb_open(bigint, bigint, bigint, text);
