//! The paused tenants as every statement of the driver leaves them out: the claim and the due
//! probe ([`super::sql`]) and the fair walk ([`super::fair`]) alike.

/// `tenant` (text; NULL for a row without one) is not among the paused tenants, `$1` (their
/// names; NULL standing for rows without a tenant). A plain filter, not an anti-join with
/// `unnest($1)`: the planner estimates such an anti-join at one row, and on a table whose
/// tenant column holds values it then sorted the whole backlog for every claim (45 ms instead
/// of 0.5 ms for 100,000 rows of two tenants).
pub(super) fn unpaused(tenant: &str) -> String {
    format!(
        "CASE WHEN {tenant} IS NULL THEN array_position($1::text[], NULL) IS NULL
              ELSE {tenant} <> ALL(array_remove($1::text[], NULL)) END"
    )
}
