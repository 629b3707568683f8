//! PostgreSQL as every part of the cluster reads it: its failures as the seam's errors
//! (by SQLSTATE class), and our ids as its integers.

use hongbao_money::Error;

/// A PostgreSQL failure while `what`, of the kind its SQLSTATE class says: a lost
/// connection, a transaction rolled back, resources or the server gone (08, 40, 53, 57,
/// 58) are `Unavailable` — asked again, it may succeed; any other refusal of our SQL
/// (a constraint, a type, a missing table) is ours, a `Bug`.
pub(crate) fn pg_error(what: &str, e: impl std::borrow::Borrow<tokio_postgres::Error>) -> Error {
    let e = e.borrow();
    let what = format!("PostgreSQL, {what}");
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            let why = format!("{} ({code})", db.message());
            if ["08", "40", "53", "57", "58"].contains(&&code[..2.min(code.len())]) {
                Error::unavailable(what, why)
            } else {
                Error::bug(format!("{what}: {why}"))
            }
        }
        None => Error::unavailable(what, e.to_string()),
    }
}

/// Ids and amounts (u64) as PostgreSQL's `bigint` (i64) arrays.
pub(crate) fn i64s(v: &[u64]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}
