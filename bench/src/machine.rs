//! The machine a run was made on, for the results table.

use chrono::Local;

/// CPUs, memory, PostgreSQL version and the date of the run.
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    pub cpus: Option<usize>,
    pub ram_gib: Option<f64>,
    pub postgres: Option<String>,
    pub mariadb: Option<String>,
    /// The SQLite library built into Sluice (sqlx's bundled one).
    pub sqlite: Option<String>,
    pub date: String,
}

impl Machine {
    /// Detects what it can; anything unknown is left out of the report.
    pub(crate) async fn detect(database_url: &str, mysql_url: &str) -> Self {
        Self {
            cpus: std::thread::available_parallelism().ok().map(usize::from),
            ram_gib: std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|text| mem_total_kib(&text))
                .map(|kib| kib as f64 / (1024.0 * 1024.0)),
            postgres: postgres_version(database_url).await,
            mariadb: mysql_version(mysql_url).await,
            sqlite: sqlite_version().await,
            date: Local::now().format("%Y-%m-%d %H:%M %Z").to_string(),
        }
    }

    /// One line: "2 CPUs, 23.5 GiB RAM, PostgreSQL 15.20, 2026-12-02 14:00 +01:00".
    pub(crate) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(cpus) = self.cpus {
            parts.push(format!("{cpus} CPUs (nproc)"));
        }
        if let Some(ram) = self.ram_gib {
            parts.push(format!("{ram:.1} GiB RAM"));
        }
        if let Some(pg) = &self.postgres {
            parts.push(format!("PostgreSQL {pg}"));
        }
        if let Some(my) = &self.mariadb {
            parts.push(format!("MySQL/MariaDB {my}"));
        }
        if let Some(lite) = &self.sqlite {
            parts.push(format!("SQLite {lite}"));
        }
        parts.push(self.date.clone());
        parts.join(", ")
    }
}

/// The 1-minute load average (`/proc/loadavg`, as `uptime` shows it): how busy the machine
/// was before a measurement, on a machine others share.
pub(crate) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

async fn postgres_version(url: &str) -> Option<String> {
    let pool = sluice_testkit::db::pool(url).await.ok()?;
    let version = sqlx::query_scalar::<sqlx::Postgres, String>("SHOW server_version")
        .fetch_one(&pool)
        .await
        .ok();
    pool.close().await;
    version
}

async fn mysql_version(url: &str) -> Option<String> {
    use sqlx::Connection;
    let mut conn = sqlx::MySqlConnection::connect(url).await.ok()?;
    sqlx::query_scalar::<sqlx::MySql, String>("SELECT CAST(VERSION() AS CHAR)")
        .fetch_one(&mut conn)
        .await
        .ok()
}

async fn sqlite_version() -> Option<String> {
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
        .await
        .ok()?;
    sqlx::query_scalar::<sqlx::Sqlite, String>("SELECT sqlite_version()")
        .fetch_one(&mut conn)
        .await
        .ok()
}

/// `MemTotal:       24598300 kB` of /proc/meminfo, in KiB.
fn mem_total_kib(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_parsed() {
        let text = "MemTotal:       24598300 kB\nMemFree:  100 kB\n";
        assert_eq!(mem_total_kib(text), Some(24_598_300));
        assert_eq!(mem_total_kib("MemFree: 1 kB"), None);
    }
}
