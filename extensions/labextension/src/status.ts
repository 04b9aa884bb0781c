/**
 * What the status bar shows of the server's `/api/meterhub/status`: the text and how near the
 * stop is. Pure functions, tested without a browser (src/__tests__/status.spec.ts).
 */

/**
 * An unread notification from the billing service (a warning, a stop, an ended pass).
 */
export interface INote {
  id: number;
  kind: string;
  message: string;
}

/**
 * The answer of `GET /api/meterhub/status` (extensions/server.py).
 */
export interface IStatus {
  user: string;
  balance: string;
  currency: string;
  rate_per_hour: string;
  minutes_left: number | null;
  /**
   * The site's `billing.warn_minutes`, e.g. `[30, 10, 2]`: the meter warns at each.
   */
  warn_minutes: number[];
  profile: string;
  gpus: number;
  notifications: INote[];
}

/**
 * How near the stop is; the status bar item carries it as `data-level` for style/index.css.
 */
export type Level = 'ok' | 'warning' | 'critical';

const SYMBOLS: Record<string, string> = { CNY: '¥', USD: '$', EUR: '€' };

function left(minutes: number | null): string {
  if (minutes === null) {
    return 'not charging';
  }
  if (minutes >= 60) {
    return `${Math.floor(minutes / 60)} h left`;
  }
  return `${minutes} min left`;
}

/**
 * "¥9.87 · ¥0.10/h · 98 h left"
 */
export function statusText(status: IStatus): string {
  const symbol = SYMBOLS[status.currency] ?? `${status.currency} `;
  const balance = `${symbol}${status.balance}`;
  const rate = `${symbol}${status.rate_per_hour}/h`;
  return `${balance} · ${rate} · ${left(status.minutes_left)}`;
}

/**
 * The level for the minutes left, by the site's thresholds: `warning` at or below the largest,
 * `critical` at or below the second largest (or the only one), `ok` above them, when nothing
 * is charging, or when the site has no thresholds.
 */
export function level(
  minutesLeft: number | null,
  warnMinutes: readonly number[]
): Level {
  if (minutesLeft === null || warnMinutes.length === 0) {
    return 'ok';
  }
  const [largest, second = largest] = [...warnMinutes].sort((a, b) => b - a);
  if (minutesLeft <= second) {
    return 'critical';
  }
  if (minutesLeft <= largest) {
    return 'warning';
  }
  return 'ok';
}
