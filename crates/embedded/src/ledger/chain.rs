//! The ledger's hash chain (docs/ledger.md): `link`, `Head` and `Walk` live in
//! `hongbao_money::chain`, where the cluster backend chains its hosts' events with the same
//! function; the embedded ledger uses them from here.

pub use hongbao_money::chain::*;
