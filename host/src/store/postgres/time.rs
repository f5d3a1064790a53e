//! Reading PostgreSQL's timestamps without panicking. PostgreSQL stores `infinity`,
//! `-infinity` and years up to 294276; sqlx's own `DateTime` decoding adds the value to its
//! epoch with an unchecked `+` and panics on all three (chrono ends at year 262142). A
//! [`PgTime`] is an error naming the value instead, so a row holding one fails on its own,
//! naming its column, rather than taking the relay down with it.

use chrono::{DateTime, Utc};
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgTypeInfo, PgValueFormat, PgValueRef};
use sqlx::{Decode, Postgres, Type};

/// A `timestamptz` (or `timestamp`) read as a UTC time; out-of-range values are decode errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PgTime(pub(super) DateTime<Utc>);

impl PgTime {
    pub(super) fn utc(self) -> DateTime<Utc> {
        self.0
    }
}

impl Type<Postgres> for PgTime {
    fn type_info() -> PgTypeInfo {
        <DateTime<Utc> as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <DateTime<Utc> as Type<Postgres>>::compatible(ty)
    }
}

/// Microseconds from the Unix epoch to PostgreSQL's, 2000-01-01 00:00 UTC.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// A binary timestamp (microseconds since 2000-01-01 UTC) as a time, or why not.
fn from_pg_micros(micros: i64) -> Result<DateTime<Utc>, String> {
    match micros {
        i64::MAX => Err("the timestamp is infinity".to_owned()),
        i64::MIN => Err("the timestamp is -infinity".to_owned()),
        _ => micros
            .checked_add(PG_EPOCH_MICROS)
            .and_then(DateTime::from_timestamp_micros)
            .ok_or_else(|| {
                format!(
                    "the timestamp ({micros} µs after 2000-01-01) is out of the range Sluice \
                     reads (years -262143 to 262142)"
                )
            }),
    }
}

impl<'r> Decode<'r, Postgres> for PgTime {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        match value.format() {
            PgValueFormat::Binary => {
                let micros = <i64 as Decode<Postgres>>::decode(value)?;
                Ok(Self(from_pg_micros(micros)?))
            }
            // Parsed, not added: out-of-range text is an error there already.
            PgValueFormat::Text => Ok(Self(<DateTime<Utc> as Decode<Postgres>>::decode(value)?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infinities_and_times_beyond_chrono_are_errors_not_panics() {
        assert_eq!(
            from_pg_micros(0).unwrap().to_rfc3339(),
            "2000-01-01T00:00:00+00:00"
        );
        assert_eq!(
            from_pg_micros(-PG_EPOCH_MICROS).unwrap().timestamp_millis(),
            0
        );
        assert!(from_pg_micros(i64::MAX).unwrap_err().contains("infinity"));
        assert!(from_pg_micros(i64::MIN).unwrap_err().contains("-infinity"));
        // 294000-01-01, which PostgreSQL stores and chrono cannot hold.
        let far = 9_215_000_000_000_000_000;
        assert!(
            from_pg_micros(far)
                .unwrap_err()
                .contains("out of the range")
        );
    }
}
