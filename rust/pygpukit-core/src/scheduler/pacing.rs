//! Per-tenant token buckets over GPU time. Tokens are milliseconds of GPU
//! time; they refill at `rate` (the tenant's share) per millisecond of wall
//! time, up to `rate * burst_ms`, and measured launch times are charged
//! against them. A tenant with tokens >= 0 is within its share.

/// Float slack so that a bucket refilled exactly to zero counts as within share.
const EPS: f64 = 1e-9;

#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    rate: f64,
    burst_ms: f64,
    tokens: f64,
    last_ms: f64,
}

impl Bucket {
    /// Starts full, so a new tenant may run at once.
    pub fn new(rate: f64, burst_ms: f64, now: f64) -> Self {
        Self {
            rate,
            burst_ms,
            tokens: rate * burst_ms,
            last_ms: now,
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    fn cap(&self) -> f64 {
        self.rate * self.burst_ms
    }

    /// Tokens at `now` without changing the bucket; time before the last
    /// update adds nothing (callers may report slightly stale times).
    pub fn tokens_at(&self, now: f64) -> f64 {
        if now > self.last_ms {
            (self.tokens + self.rate * (now - self.last_ms)).min(self.cap().max(self.tokens))
        } else {
            self.tokens
        }
    }

    fn settle(&mut self, now: f64) {
        self.tokens = self.tokens_at(now);
        self.last_ms = self.last_ms.max(now);
    }

    pub fn charge(&mut self, gpu_ms: f64, now: f64) {
        self.settle(now);
        self.tokens -= gpu_ms;
    }

    pub fn set_rate(&mut self, rate: f64, now: f64) {
        self.settle(now);
        self.rate = rate;
        self.tokens = self.tokens.min(self.cap());
    }

    /// A zero share is never within share: such a tenant runs only on
    /// capacity nobody else wants.
    pub fn within_share(&self, now: f64) -> bool {
        self.rate > 0.0 && self.tokens_at(now) >= -EPS
    }

    /// Earliest time the bucket is back within share (now if it is);
    /// None for a zero share.
    pub fn ready_at(&self, now: f64) -> Option<f64> {
        if self.within_share(now) {
            Some(now)
        } else if self.rate > 0.0 {
            Some(now.max(self.last_ms) - self.tokens_at(now) / self.rate)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refill_charge_and_ready_time() {
        let mut b = Bucket::new(0.5, 10.0, 0.0);
        assert_eq!(b.tokens_at(0.0), 5.0);
        assert_eq!(b.tokens_at(100.0), 5.0, "capped at rate * burst");
        b.charge(9.0, 2.0);
        assert_eq!(b.tokens_at(2.0), -4.0);
        assert!(!b.within_share(2.0));
        assert_eq!(b.ready_at(2.0), Some(10.0));
        assert!(b.within_share(10.0));
        assert_eq!(b.tokens_at(1.0), -4.0, "time going back adds nothing");
        b.set_rate(0.0, 4.0);
        assert!(!b.within_share(1e9));
        assert_eq!(b.ready_at(5.0), None);
    }
}
