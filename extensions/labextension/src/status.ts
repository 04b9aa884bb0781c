/**
 * What the status bar shows of the server's `/api/meterhub/status`: the text and how near the
 * stop is — by credit, by an idle timeout ("· idle: stops in 4 min") or by the session's spend
 * or time cap ("· cap: stops in 12 min"). Pure functions, tested without a browser
 * (src/__tests__/status.spec.ts).
 */

/**
 * What the status bar needs of JupyterLab's translation API: `__` of a
 * `TranslationBundle` (@jupyterlab/translation), `%1` for its first argument.
 */
export interface ITranslation {
  __(msgid: string, ...args: unknown[]): string;
}

/**
 * The English of the msgids themselves, for tests and a JupyterLab without a translator.
 */
export const ENGLISH: ITranslation = {
  __: (msgid: string, ...args: unknown[]) =>
    msgid.replace(/%(\d+)/g, (placeholder, n) =>
      Number(n) <= args.length ? String(args[Number(n) - 1]) : placeholder
    )
};

/**
 * An unread notification from the billing service (a warning, a stop, an ended pass).
 */
export interface INote {
  id: number;
  kind: string;
  message: string;
}

/**
 * What a kind of notification means to JupyterLab.
 */
export interface INoteKind {
  /**
   * It announces a stop meterhub causes: open documents are saved before it (src/saver.ts).
   */
  stop: boolean;
  /**
   * It is an idle warning: shown with "Keep running", which counts as activity.
   */
  keepRunning: boolean;
}

/**
 * The kinds of notification JupyterLab shows as warnings, which stay until dismissed: the
 * meter's credit and lab-window warnings (`warning`), its idle and cap warnings, a stop, and an
 * ended pass (which comes after the fact and saves nothing). Any other kind, such as
 * `restarted` (an idle or capped server now runs in debug mode), is information.
 */
export const WARNING_KINDS: ReadonlyMap<string, INoteKind> = new Map([
  ['warning', { stop: true, keepRunning: false }],
  ['idle-warning', { stop: true, keepRunning: true }],
  ['cap-warning', { stop: true, keepRunning: false }],
  ['stopped', { stop: true, keepRunning: false }],
  ['pass-ended', { stop: false, keepRunning: false }]
]);

/**
 * How long this server has been idle, and what happens when it has been idle too long.
 */
export interface IIdle {
  /**
   * Seconds since this server's last activity.
   */
  idle_seconds: number;
  /**
   * The idle action happens at this many idle seconds.
   */
  limit_seconds: number;
  /**
   * The user is warned this many seconds before the idle action.
   */
  warn_seconds: number;
  /**
   * `stop` (files kept) or `debug` (restarted in debug mode on the same disk).
   */
  action: 'stop' | 'debug';
}

/**
 * The soonest stop the meter can foresee, and why: out of credit, idle, or the session's cap.
 */
export interface IStop {
  reason: 'idle' | 'credit' | 'cap';
  in_seconds: number;
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
  /**
   * Null when this server has no idle timeout; absent from a server older than idle shutdown.
   */
  idle?: IIdle | null;
  /**
   * Null when no stop is foreseeable; absent from a server older than idle shutdown.
   */
  stop?: IStop | null;
}

/**
 * How near the stop is; the status bar item carries it as `data-level` for style/index.css.
 */
export type Level = 'ok' | 'warning' | 'critical';

const SYMBOLS: Record<string, string> = { CNY: '¥', USD: '$', EUR: '€' };

function left(minutes: number | null, trans: ITranslation): string {
  if (minutes === null) {
    return trans.__('not charging');
  }
  if (minutes >= 60) {
    return trans.__('%1 h left', Math.floor(minutes / 60));
  }
  return trans.__('%1 min left', minutes);
}

/**
 * "in 4 min", "in under 1 min", "in 2 h": whole units, rounded down, so the time left is never
 * overstated.
 */
function within(seconds: number, trans: ITranslation): string {
  const minutes = Math.floor(Math.max(0, seconds) / 60);
  if (minutes < 1) {
    return trans.__('in under 1 min');
  }
  if (minutes >= 60) {
    return trans.__('in %1 h', Math.floor(minutes / 60));
  }
  return trans.__('in %1 min', minutes);
}

/**
 * Seconds until the idle action while the user is being warned of it (at most `warn_seconds`
 * before it), else null: not idle long enough, no idle timeout, or an older server.
 */
export function idleSecondsLeft(idle: IIdle | null | undefined): number | null {
  if (!idle) {
    return null;
  }
  const left = idle.limit_seconds - idle.idle_seconds;
  return left <= idle.warn_seconds ? Math.max(0, left) : null;
}

/**
 * "¥9.87 · ¥0.10/h · 98 h left", then "· idle: stops in 4 min" (or "· idle: debug mode in
 * 4 min") while the idle action is near, and "· cap: stops in 12 min" when the session's cap
 * is the soonest stop. A credit stop adds nothing: the minutes left already say it.
 */
export function statusText(
  status: IStatus,
  trans: ITranslation = ENGLISH
): string {
  const symbol = SYMBOLS[status.currency] ?? `${status.currency} `;
  const balance = `${symbol}${status.balance}`;
  const rate = trans.__('%1/h', `${symbol}${status.rate_per_hour}`);
  const parts = [balance, rate, left(status.minutes_left, trans)];
  const idleLeft = idleSecondsLeft(status.idle);
  if (idleLeft !== null) {
    const when = within(idleLeft, trans);
    parts.push(
      status.idle?.action === 'debug'
        ? trans.__('idle: debug mode %1', when)
        : trans.__('idle: stops %1', when)
    );
  }
  if (status.stop?.reason === 'cap') {
    parts.push(
      trans.__('cap: stops %1', within(status.stop.in_seconds, trans))
    );
  }
  return parts.join(' · ');
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

const ORDER: readonly Level[] = ['ok', 'warning', 'critical'];

/**
 * The status bar's level: the nearest of the credit's and the cap's stop by the site's
 * thresholds (`level`), and at least `warning` while the idle action is near — `critical` in its
 * last minute.
 */
export function statusLevel(status: IStatus): Level {
  const warnMinutes = status.warn_minutes ?? [];
  const levels = [level(status.minutes_left, warnMinutes)];
  if (status.stop?.reason === 'cap') {
    levels.push(level(Math.floor(status.stop.in_seconds / 60), warnMinutes));
  }
  const idleLeft = idleSecondsLeft(status.idle);
  if (idleLeft !== null) {
    levels.push(idleLeft <= 60 ? 'critical' : 'warning');
  }
  return levels.reduce((a, b) => (ORDER.indexOf(b) > ORDER.indexOf(a) ? b : a));
}
