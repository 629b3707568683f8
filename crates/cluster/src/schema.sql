-- hongbao's cluster ledger. Every statement is idempotent: each gateway runs this file at
-- start (under an advisory lock), so the first host creates the schema and the others
-- find it. docs/scale-out.md describes the layout.
--
-- This file only adds (expand): while a host of the version before is alive it must find
-- every table, column and function it calls. A function whose arguments or meaning change
-- is created under a new signature or name beside the old one; what only older versions
-- need is dropped in contract.sql, once no older host is alive (versions.rs).
CREATE TABLE IF NOT EXISTS hb_campaigns (
    id integer PRIMARY KEY,
    kind text NOT NULL,
    packets integer NOT NULL,
    rate integer NOT NULL,
    amount_min bigint NOT NULL,
    amount_max bigint NOT NULL,
    recipients integer NOT NULL,
    user_min bigint NOT NULL,
    user_max bigint NOT NULL,
    seed bigint NOT NULL,
    minted bigint NOT NULL,
    started_ms bigint NOT NULL
);
-- The admin key that started each campaign (none for campaigns from before keys).
ALTER TABLE hb_campaigns ADD COLUMN IF NOT EXISTS created_by text;
CREATE TABLE IF NOT EXISTS hb_balances (
    user_id bigint PRIMARY KEY,
    cents bigint NOT NULL CHECK (cents >= 0)
);
CREATE TABLE IF NOT EXISTS hb_events (
    seq bigserial PRIMARY KEY,
    at_ms bigint NOT NULL,
    host text NOT NULL,
    user_id bigint,
    body jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS hb_events_user ON hb_events (user_id, seq);
-- The hash chain (docs/scale-out.md, "The hash chain"): one chain per gateway host, each
-- event's hash set as it is inserted (`hb_chain`, below) from its host's newest event
-- (hb_events_host), a row per host in hb_chain_hosts to lock, and the newest seq from
-- before the chain in hb_chain_since.
ALTER TABLE hb_events ADD COLUMN IF NOT EXISTS hash bytea;
CREATE INDEX IF NOT EXISTS hb_events_host ON hb_events (host, seq);
CREATE TABLE IF NOT EXISTS hb_chain_hosts (
    host text PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS hb_chain_since (
    seq bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS hb_wins (
    packet bigint PRIMARY KEY,
    campaign integer NOT NULL,
    user_id bigint NOT NULL,
    cents bigint NOT NULL
);
-- The op that won it: drawn by the host once per op, the same when its batch is sent again
-- (none for wins from before op ids).
ALTER TABLE hb_wins ADD COLUMN IF NOT EXISTS op_id bigint;
CREATE TABLE IF NOT EXISTS hb_packets (
    id bigint PRIMARY KEY,
    sender bigint NOT NULL,
    campaign integer,
    cents bigint NOT NULL,
    shares integer NOT NULL,
    opened integer NOT NULL DEFAULT 0,
    opened_cents bigint NOT NULL DEFAULT 0,
    expires_ms bigint NOT NULL,
    refunded bigint
);
CREATE INDEX IF NOT EXISTS hb_packets_live ON hb_packets (expires_ms) WHERE refunded IS NULL;
CREATE INDEX IF NOT EXISTS hb_packets_campaign ON hb_packets (campaign) WHERE campaign IS NOT NULL;
CREATE TABLE IF NOT EXISTS hb_shares (
    packet bigint NOT NULL,
    idx integer NOT NULL,
    cents bigint NOT NULL,
    PRIMARY KEY (packet, idx)
);
CREATE TABLE IF NOT EXISTS hb_recipients (
    packet bigint NOT NULL,
    user_id bigint NOT NULL,
    opened_cents bigint,
    PRIMARY KEY (packet, user_id)
);
-- The open that opened the share (as hb_wins.op_id).
ALTER TABLE hb_recipients ADD COLUMN IF NOT EXISTS opened_by bigint;
CREATE INDEX IF NOT EXISTS hb_waiting ON hb_recipients (user_id) WHERE opened_cents IS NULL;
CREATE TABLE IF NOT EXISTS hb_idempotency (
    sender bigint NOT NULL,
    key text NOT NULL,
    packet bigint NOT NULL,
    cents bigint NOT NULL,
    shares integer NOT NULL,
    recipients bigint[] NOT NULL,
    balance bigint NOT NULL,
    PRIMARY KEY (sender, key)
);
CREATE SEQUENCE IF NOT EXISTS hb_campaign_ids;
-- Blocks of 4096 packet ids, one block per call: a host numbers its sends without a round
-- trip each. Ids stay below 2^32 for a long while; campaign packets are campaign << 32 | i.
CREATE SEQUENCE IF NOT EXISTS hb_packet_blocks;

CREATE OR REPLACE FUNCTION hb_credit(p_user bigint, p_cents bigint) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO hb_balances (user_id, cents) VALUES (p_user, p_cents)
    ON CONFLICT (user_id) DO UPDATE SET cents = hb_balances.cents + EXCLUDED.cents
$$;

-- Shards (shard.rs, docs/scale-out.md "Shards"): the map as this formation recorded it,
-- credits this formation owes wallets on other shards (its outbox: committed with the win
-- or the open that makes them, relayed by relay.rs, marked moved once the wallet's shard
-- has them), and credits this formation's wallets were paid from other shards, one row
-- per op (the relay's idempotency: a credit relayed twice is paid once). Outbox rows are
-- kept once moved: the audit sums both tables (credits in flight = sent - received).
CREATE TABLE IF NOT EXISTS hb_shard_map (
    version integer PRIMARY KEY,
    shards integer NOT NULL,
    me integer NOT NULL,
    written_ms bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS hb_outbox (
    op bigint PRIMARY KEY,
    to_shard integer NOT NULL,
    user_id bigint NOT NULL,
    cents bigint NOT NULL CHECK (cents > 0),
    made_ms bigint NOT NULL,
    moved_ms bigint
);
CREATE INDEX IF NOT EXISTS hb_outbox_waiting ON hb_outbox (op) WHERE moved_ms IS NULL;
CREATE TABLE IF NOT EXISTS hb_credits_in (
    op bigint PRIMARY KEY,
    from_shard integer NOT NULL,
    user_id bigint NOT NULL,
    cents bigint NOT NULL,
    at_ms bigint NOT NULL
);

-- Pays `p_cents` to `p_user` for op `p_op`: here when the wallet is on this shard
-- (`p_wallet` NULL), else as an outbox row for the wallet's shard `p_wallet`.
CREATE OR REPLACE FUNCTION hb_pay(p_user bigint, p_cents bigint, p_op bigint,
    p_wallet integer, p_at bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_wallet IS NULL THEN
        PERFORM hb_credit(p_user, p_cents);
    ELSIF p_cents > 0 THEN
        INSERT INTO hb_outbox (op, to_shard, user_id, cents, made_ms)
            VALUES (p_op, p_wallet, p_user, p_cents, p_at);
    END IF;
END $$;

-- Credits relayed from shard `p_from`: each op paid once, however often it is relayed
-- (a relay killed after this commit and before its outbox rows were marked moved sends
-- them again). Returns how many were paid now. Ops come sorted by user (relay.rs), so two
-- relays lock balance rows in one order.
CREATE OR REPLACE FUNCTION hb_take_credits(p_from integer, p_ops bigint[], p_users bigint[],
    p_cents bigint[], p_at bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE n integer := 0;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_ops), 0) LOOP
        INSERT INTO hb_credits_in (op, from_shard, user_id, cents, at_ms)
            VALUES (p_ops[i], p_from, p_users[i], p_cents[i], p_at) ON CONFLICT (op) DO NOTHING;
        IF FOUND THEN
            PERFORM hb_credit(p_users[i], p_cents[i]);
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;

-- A shake packet won: once per packet. Asked again, it is true only for the same op (its
-- batch sent again after its COMMIT went unanswered: the win is told, not paid twice); a
-- packet dealt twice — back from a failed batch, or restored after Redis lost its state —
-- and won again, even by the same user, is another op: false. The winner is paid here,
-- or by the outbox when their wallet is on shard `p_wallet` (hb_pay).
CREATE OR REPLACE FUNCTION hb_win(p_packet bigint, p_campaign integer, p_user bigint,
    p_cents bigint, p_op bigint, p_at bigint, p_host text, p_body jsonb, p_wallet integer)
    RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO hb_wins (packet, campaign, user_id, cents, op_id)
        VALUES (p_packet, p_campaign, p_user, p_cents, p_op) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN EXISTS (SELECT 1 FROM hb_wins WHERE packet = p_packet AND op_id = p_op);
    END IF;
    PERFORM hb_pay(p_user, p_cents, p_op, p_wallet, p_at);
    INSERT INTO hb_events (at_ms, host, user_id, body) VALUES (p_at, p_host, p_user, p_body);
    RETURN true;
END $$;

-- The signature of hosts from before shards: the wallet here.
CREATE OR REPLACE FUNCTION hb_win(p_packet bigint, p_campaign integer, p_user bigint,
    p_cents bigint, p_op bigint, p_at bigint, p_host text, p_body jsonb) RETURNS boolean
LANGUAGE sql AS $$
    SELECT hb_win(p_packet, p_campaign, p_user, p_cents, p_op, p_at, p_host, p_body, NULL::integer)
$$;

-- A user's send: 'ok' | 'insufficient-funds' | 'key-reused', the packet and the balance.
-- Sent again (its batch's COMMIT unanswered), a send already made is found by its key, or
-- without one by its packet id (the host's, drawn once per send) with the same sender,
-- amount, shares and recipients: 'ok', debited once (the balance told is today's).
CREATE OR REPLACE FUNCTION hb_send(p_sender bigint, p_packet bigint, p_cents bigint,
    p_recipients bigint[], p_shares bigint[], p_expires bigint, p_key text, p_at bigint,
    p_host text, p_body jsonb, OUT result text, OUT packet bigint, OUT balance bigint)
LANGUAGE plpgsql AS $$
DECLARE first hb_idempotency;
BEGIN
    IF p_key IS NOT NULL THEN
        SELECT * INTO first FROM hb_idempotency WHERE sender = p_sender AND key = p_key;
        IF FOUND THEN
            packet := first.packet; balance := first.balance;
            IF first.cents = p_cents AND first.shares = cardinality(p_shares)
               AND first.recipients = p_recipients THEN
                result := 'ok';
            ELSE
                result := 'key-reused';
            END IF;
            RETURN;
        END IF;
    END IF;
    IF EXISTS (SELECT 1 FROM hb_packets WHERE id = p_packet AND sender = p_sender
               AND campaign IS NULL AND cents = p_cents AND shares = cardinality(p_shares))
       AND (SELECT array_agg(r.user_id ORDER BY r.user_id) FROM hb_recipients r
            WHERE r.packet = p_packet) = (SELECT array_agg(u ORDER BY u) FROM unnest(p_recipients) u)
    THEN
        result := 'ok'; packet := p_packet;
        SELECT coalesce(max(cents), 0) INTO balance FROM hb_balances WHERE user_id = p_sender;
        RETURN;
    END IF;
    UPDATE hb_balances SET cents = cents - p_cents
        WHERE user_id = p_sender AND cents >= p_cents RETURNING cents INTO balance;
    IF NOT FOUND THEN
        result := 'insufficient-funds'; packet := 0;
        SELECT coalesce(max(cents), 0) INTO balance FROM hb_balances WHERE user_id = p_sender;
        RETURN;
    END IF;
    PERFORM hb_new_packet(p_packet, p_sender, NULL, p_cents, p_recipients, p_shares, p_expires);
    IF p_key IS NOT NULL THEN
        INSERT INTO hb_idempotency VALUES (p_sender, p_key, p_packet, p_cents,
            cardinality(p_shares), p_recipients, balance);
    END IF;
    INSERT INTO hb_events (at_ms, host, user_id, body) VALUES (p_at, p_host, p_sender, p_body);
    result := 'ok'; packet := p_packet;
END $$;

CREATE OR REPLACE FUNCTION hb_new_packet(p_packet bigint, p_sender bigint, p_campaign integer,
    p_cents bigint, p_recipients bigint[], p_shares bigint[], p_expires bigint) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO hb_packets (id, sender, campaign, cents, shares, expires_ms)
        VALUES (p_packet, p_sender, p_campaign, p_cents, cardinality(p_shares), p_expires);
    INSERT INTO hb_shares SELECT p_packet, i - 1, p_shares[i] FROM generate_subscripts(p_shares, 1) i;
    INSERT INTO hb_recipients SELECT p_packet, u, NULL FROM unnest(p_recipients) u;
$$;

-- A send campaign's packet `p_packet`: created once, however often it is released. Two
-- hosts may create it at once (a host thought dead whose packets were released again):
-- the insert that comes second waits for the first to commit and then inserts nothing,
-- so it returns false instead of failing its whole batch on the primary key.
CREATE OR REPLACE FUNCTION hb_campaign_packet(p_packet bigint, p_campaign integer,
    p_cents bigint, p_recipients bigint[], p_shares bigint[], p_expires bigint, p_at bigint,
    p_host text, p_body jsonb) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO hb_packets (id, sender, campaign, cents, shares, expires_ms)
        VALUES (p_packet, 0, p_campaign, p_cents, cardinality(p_shares), p_expires)
        ON CONFLICT (id) DO NOTHING;
    IF NOT FOUND THEN RETURN false; END IF;
    INSERT INTO hb_shares SELECT p_packet, i - 1, p_shares[i] FROM generate_subscripts(p_shares, 1) i;
    INSERT INTO hb_recipients SELECT p_packet, u, NULL FROM unnest(p_recipients) u;
    INSERT INTO hb_events (at_ms, host, user_id, body) VALUES (p_at, p_host, NULL, p_body);
    RETURN true;
END $$;

-- One share of a sent packet for a recipient: the result name and the cents. The share
-- found opened by the same op (its batch sent again after its COMMIT went unanswered) is
-- told 'opened' again; by another op, 'already-opened'. The recipient is paid as a winner
-- is (hb_pay).
CREATE OR REPLACE FUNCTION hb_open(p_packet bigint, p_user bigint, p_op bigint, p_at bigint,
    p_host text, p_wallet integer, OUT result text, OUT got bigint)
LANGUAGE plpgsql AS $$
DECLARE p hb_packets; mine bigint; found_me boolean; by_op bigint;
BEGIN
    got := 0;
    SELECT * INTO p FROM hb_packets WHERE id = p_packet FOR UPDATE;
    IF NOT FOUND THEN result := 'no-such-packet'; RETURN; END IF;
    SELECT true, opened_cents, opened_by INTO found_me, mine, by_op FROM hb_recipients
        WHERE packet = p_packet AND user_id = p_user;
    IF found_me IS NULL THEN result := 'not-a-recipient'; RETURN; END IF;
    IF mine IS NOT NULL THEN
        result := CASE WHEN by_op = p_op THEN 'opened' ELSE 'already-opened' END;
        got := mine;
        RETURN;
    END IF;
    IF p.refunded IS NOT NULL OR p_at >= p.expires_ms THEN result := 'expired'; RETURN; END IF;
    IF p.opened >= p.shares THEN result := 'empty'; RETURN; END IF;
    SELECT s.cents INTO got FROM hb_shares s WHERE s.packet = p_packet AND s.idx = p.opened;
    UPDATE hb_packets SET opened = opened + 1, opened_cents = opened_cents + got
        WHERE id = p_packet;
    UPDATE hb_recipients SET opened_cents = got, opened_by = p_op
        WHERE packet = p_packet AND user_id = p_user;
    PERFORM hb_pay(p_user, got, p_op, p_wallet, p_at);
    INSERT INTO hb_events (at_ms, host, user_id, body) VALUES (p_at, p_host, p_user,
        jsonb_build_object('kind', 'share_opened', 'packet', p_packet, 'user', p_user,
            'amount_cents', got));
    result := 'opened';
END $$;

-- The signature of hosts from before shards: the wallet here.
CREATE OR REPLACE FUNCTION hb_open(p_packet bigint, p_user bigint, p_op bigint, p_at bigint,
    p_host text, OUT result text, OUT got bigint)
LANGUAGE sql AS $$
    SELECT * FROM hb_open(p_packet, p_user, p_op, p_at, p_host, NULL::integer)
$$;

-- Packets whose time ran out give what is unopened back to their sender (a user's
-- balance; a campaign keeps its own). Any host may run it: SKIP LOCKED shares the work.
CREATE OR REPLACE FUNCTION hb_expire(p_now bigint, p_host text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE p record; n integer := 0; back bigint;
BEGIN
    FOR p IN SELECT id, sender, campaign, cents, opened_cents FROM hb_packets
             WHERE refunded IS NULL AND expires_ms <= p_now
             ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED LOOP
        back := p.cents - p.opened_cents;
        UPDATE hb_packets SET refunded = back WHERE id = p.id;
        IF p.campaign IS NULL AND back > 0 THEN PERFORM hb_credit(p.sender, back); END IF;
        INSERT INTO hb_events (at_ms, host, user_id, body) VALUES (p_now, p_host,
            CASE WHEN p.campaign IS NULL THEN p.sender END,
            jsonb_build_object('kind', 'packet_expired', 'packet', p.id,
                'sender', CASE WHEN p.campaign IS NULL THEN jsonb_build_object('User', p.sender)
                               ELSE jsonb_build_object('Campaign', p.campaign) END,
                'refund_cents', back));
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

-- An event's number and hash, chained from the newest event of its host
-- (hongbao_money::chain::link): SHA-256("hongbao ledger v1" ‖ prev ‖ seq ‖ at_ms ‖ body),
-- seq and at_ms 8 bytes big-endian (int8send), body the jsonb's text as PostgreSQL writes
-- it, prev 32 zero bytes for a host's first event (or its newest is from before the
-- chain). The host's row in hb_chain_hosts is locked first and the seq drawn under that
-- lock, so a host's events are numbered in the order they are chained whatever its
-- transactions do; the lock is per host: hosts never wait on each other. The row is only
-- locked, never updated: a batch of n events updating one row would leave n versions of
-- it for each lookup to step through (n² in all; a million events in one transaction did
-- not finish in 8 minutes).
CREATE OR REPLACE FUNCTION hb_chain() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE prev bytea;
BEGIN
    PERFORM 1 FROM hb_chain_hosts WHERE host = NEW.host FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO hb_chain_hosts VALUES (NEW.host) ON CONFLICT (host) DO NOTHING;
        PERFORM 1 FROM hb_chain_hosts WHERE host = NEW.host FOR UPDATE;
    END IF;
    NEW.seq := nextval('hb_events_seq_seq');
    SELECT hash INTO prev FROM hb_events WHERE host = NEW.host ORDER BY seq DESC LIMIT 1;
    NEW.hash := sha256('hongbao ledger v1'::bytea
        || coalesce(prev, decode(repeat('00', 32), 'hex'))
        || int8send(NEW.seq) || int8send(NEW.at_ms) || convert_to(NEW.body::text, 'UTF8'));
    RETURN NEW;
END $$;

-- The trigger, once; from then on it numbers every event (the column's default is
-- dropped). Creating it waits for every transaction inserting events to end and holds new
-- ones back until this file's transaction commits, so every event after the newest seq
-- written down here is chained, and every event up to it is from before.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'hb_events_chain' AND tgrelid = 'hb_events'::regclass) THEN
        CREATE TRIGGER hb_events_chain BEFORE INSERT ON hb_events
            FOR EACH ROW EXECUTE FUNCTION hb_chain();
        ALTER TABLE hb_events ALTER COLUMN seq DROP DEFAULT;
        INSERT INTO hb_chain_since SELECT coalesce(max(seq), 0) FROM hb_events;
    END IF;
END $$;

-- The versions (versions.rs, docs/scale-out.md "Upgrading one gateway at a time"): the
-- one each host runs, recorded at its start, and the versions the schema was contracted
-- to (what only older versions needed, dropped).
CREATE TABLE IF NOT EXISTS hb_host_versions (
    host text PRIMARY KEY,
    version integer NOT NULL,
    started_ms bigint NOT NULL
);
-- The shard map version each host numbers campaigns under (shard.rs, "Growing"), on
-- shard 0: a campaign under a newer version waits for every live host to run it.
CREATE TABLE IF NOT EXISTS hb_host_maps (
    host text PRIMARY KEY,
    version integer NOT NULL,
    written_ms bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS hb_schema_contracted (
    version integer PRIMARY KEY,
    at_ms bigint NOT NULL
);
