//! Writes a ledger of N events a server can open and `hongbao ledger verify` passes: one
//! shake campaign of N − 1 packets and every packet won (users 1..=1,000,000 in turn),
//! appended through the ledger the server uses (its hash chain included), in batches as
//! the writer thread commits them. For the backup, restore and verify timings of
//! docs/BENCHMARKS.md ("The ledger").
//!
//!   cargo run --release -p hongbao-embedded --example ledger_fill -- DIR N
//!
//! Prints the events a second and the file's bytes an event; also, with `--chain-cost`,
//! what the chain itself costs: the hash of an event (ns) and its bytes in the file (the
//! ledger measured again with its hash column dropped and vacuumed).

use std::time::Instant;

use hongbao_embedded::ledger::{chain, Ledger};
use hongbao_money::event::{shake_amount, Event, Record};

const BATCH: u64 = 4096;
const USERS: u64 = 1_000_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(n)) = (args.get(1), args.get(2)) else {
        return Err("usage: ledger_fill DIR N [--chain-cost]".into());
    };
    let n: u64 = n.parse()?;
    let dir = std::path::Path::new(dir);
    if dir.join("ledger.sqlite").exists() {
        return Err(format!("{} holds a ledger already", dir.display()).into());
    }
    let packets = (n - 1) as u32;
    let (seed, min, max) = (45, 100, 10_000);
    let minted: u64 = (0..packets).map(|i| shake_amount(seed, i, min, max)).sum();
    let mut ledger = Ledger::open(dir)?;
    let started = Instant::now();
    let t0 = hongbao_sys::clock::unix_ms();
    let mut batch = vec![Record {
        seq: 1,
        ts_ms: t0,
        event: Event::ShakeCampaign {
            campaign: 1,
            packets,
            rate_per_sec: 1_000_000,
            amount_min: min,
            amount_max: max,
            seed,
            minted_cents: minted,
            by: Some("fill".into()),
        },
    }];
    for i in 0..packets {
        let seq = i as u64 + 2;
        batch.push(Record {
            seq,
            ts_ms: t0 + seq / 1000,
            event: Event::ShakeWon {
                campaign: 1,
                index: i,
                user: i as u64 % USERS + 1,
                amount_cents: shake_amount(seed, i, min, max),
            },
        });
        if batch.len() as u64 == BATCH {
            ledger.append(&batch)?;
            batch.clear();
        }
    }
    ledger.append(&batch)?;
    let secs = started.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(dir.join("ledger.sqlite"))?.len();
    drop(ledger);
    println!(
        "ledger_fill: {n} events in {secs:.1} s ({:.0}/s), {bytes} bytes ({:.1} an event)",
        n as f64 / secs,
        bytes as f64 / n as f64
    );
    if args.iter().any(|a| a == "--chain-cost") {
        chain_cost(dir, n)?;
    }
    Ok(())
}

/// The hash's CPU an event, over the ledger's own bodies, and its bytes: the file
/// vacuumed with the hash column, then without.
fn chain_cost(dir: &std::path::Path, n: u64) -> Result<(), Box<dyn std::error::Error>> {
    let conn = rusqlite::Connection::open(dir.join("ledger.sqlite"))?;
    let bodies: Vec<(u64, u64, String)> = {
        let mut stmt =
            conn.prepare("SELECT seq, ts_ms, body FROM events ORDER BY seq LIMIT 200000")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, i64>(1)? as u64,
                r.get(2)?,
            ))
        })?;
        rows.collect::<Result<_, _>>()?
    };
    let started = Instant::now();
    let mut head = chain::Head::default();
    for (seq, ts, body) in &bodies {
        head = head.next(*seq, *ts, body);
    }
    let ns = started.elapsed().as_nanos() as f64 / bodies.len() as f64;
    let mean_body = bodies.iter().map(|b| b.2.len()).sum::<usize>() as f64 / bodies.len() as f64;
    let size = |c: &rusqlite::Connection| -> Result<u64, rusqlite::Error> {
        c.execute_batch("VACUUM")?;
        c.query_row(
            "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|b| b as u64)
    };
    let with = size(&conn)?;
    conn.execute_batch("ALTER TABLE events DROP COLUMN hash")?;
    let without = size(&conn)?;
    println!(
        "chain: {ns:.0} ns an event to hash (bodies of {mean_body:.0} bytes, head {}); the file {with} bytes with the hashes, {without} without: {:.1} bytes an event",
        head.text(),
        (with as f64 - without as f64) / n as f64
    );
    Ok(())
}
