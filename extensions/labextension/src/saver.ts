/**
 * Save before a stop meterhub causes: when the meter warns (credit, cap, idle) or stops a server,
 * and again when the status says a stop is at most 45 s away, JupyterLab saves every open
 * document that has unsaved changes and can be written — after telling its server
 * (`POST api/meterhub/saving`), so that the save does not count as activity and cancel the idle
 * stop it prepares for. No browser needed: the class takes the functions that list the
 * documents and call the server (src/__tests__/saver.spec.ts).
 */
import type { IPoll, Poll } from '@lumino/polling';

import { INote, IStop, WARNING_KINDS } from './status';

/**
 * A stop at most this far away is saved for (once per stop). The poll must come at least this
 * often, or it could miss the window (`HIDDEN_POLL_INTERVAL_MS`).
 */
export const SAVE_BEFORE_STOP_SECONDS = 45;

/**
 * How much later a foreseen stop may come in the next status and still be the same stop:
 * `in_seconds` is whole seconds, and each answer is some time on its way. A stop that moved
 * later by more (activity postponed an idle stop, a grant a credit stop) is a new one.
 */
export const STOP_SLACK_SECONDS = 5;

/**
 * How often the status is asked for while the tab is shown: the meter moves credit once a
 * minute by default.
 */
export const POLL_INTERVAL_MS = 15 * 1000;

/**
 * How often the status is asked for while the tab is hidden. A hidden tab must keep asking, or
 * nothing would save its documents before a stop; it asks half as often as a shown one, so that
 * forgotten tabs cost the server less, but still more often than `SAVE_BEFORE_STOP_SECONDS`, so
 * one answer always falls inside the last 45 s with at least 15 s to save in (unless the
 * browser throttles its timers further: docs/idle.md).
 */
export const HIDDEN_POLL_INTERVAL_MS = 30 * 1000;

/**
 * The longest wait between tries while the server fails (each failure doubles the wait).
 */
export const MAX_POLL_INTERVAL_MS = 5 * 60 * 1000;

/**
 * How often the status poll asks: slower while the tab is hidden, backing off while the server
 * fails.
 */
export function pollFrequency(hidden: boolean): IPoll.Frequency {
  return {
    interval: hidden ? HIDDEN_POLL_INTERVAL_MS : POLL_INTERVAL_MS,
    backoff: true,
    max: MAX_POLL_INTERVAL_MS
  };
}

/**
 * The options of the status poll (in JupyterLab's `Poll`): it never stands by, so that a hidden
 * tab still saves before a stop; it only asks less often (`pollFrequency`).
 */
export function statusPollOptions(
  factory: () => Promise<void>,
  hidden: boolean
): Poll.IOptions<void, void, 'standby'> {
  return {
    factory,
    frequency: pollFrequency(hidden),
    name: '@meterhub/credit-status:CreditStatus#status',
    standby: 'never'
  };
}

/**
 * An open document as the saver sees it (in JupyterLab: a document context).
 */
export interface IOpenDocument {
  path: string;
  /**
   * Whether it has changes not yet on disk.
   */
  dirty: boolean;
  /**
   * Whether it may be saved: not read-only in JupyterLab, writable on disk.
   */
  writable: boolean;
  save(): Promise<void>;
}

/**
 * What one save did.
 */
export interface ISaveReport {
  /**
   * Why it saved: the note's kind ("note: idle-warning") or the stop ("stop: idle in 40 s").
   */
  why: string;
  saved: string[];
  failed: string[];
}

export namespace StopSaver {
  export interface IOptions {
    /**
     * The open documents, each once (in JupyterLab: the contexts of the main area's widgets).
     */
    documents: () => IOpenDocument[];
    /**
     * Tell the server that saves made now are this extension's, not the user's activity
     * (`POST api/meterhub/saving`); rejects if the server did not hear it.
     */
    announce: () => Promise<void>;
    /**
     * Told when announcing or saving a document failed. The others are saved anyway: losing
     * work is worse than a save that cancels an idle stop.
     */
    onError?: (what: string, error: unknown) => void;
    /**
     * Milliseconds since the epoch (a fake clock in tests).
     */
    now?: () => number;
  }
}

export class StopSaver {
  constructor(options: StopSaver.IOptions) {
    this._documents = options.documents;
    this._announce = options.announce;
    this._onError = options.onError ?? (() => undefined);
    this._now = options.now ?? (() => Date.now());
  }

  /**
   * Why a status calls for a save, or null: a notification this page has not seen yet of a kind
   * that announces a stop (`WARNING_KINDS`), or a stop at most `SAVE_BEFORE_STOP_SECONDS` away that was not saved
   * for yet. A stop is saved for once; it is a new stop when the status had none or a farther
   * one in between, or when it moved later than `STOP_SLACK_SECONDS` allows.
   */
  due(notes: readonly INote[], stop: IStop | null | undefined): string | null {
    let why: string | null = null;
    for (const note of notes) {
      if (this._seen.has(note.id)) {
        continue;
      }
      this._seen.add(note.id);
      if (why === null && WARNING_KINDS.get(note.kind)?.stop) {
        why = `note: ${note.kind}`;
      }
    }
    if (!stop || stop.in_seconds > SAVE_BEFORE_STOP_SECONDS) {
      this._stop = null;
      return why;
    }
    const at = this._now() / 1000 + stop.in_seconds;
    const previous = this._stop;
    if (
      previous !== null &&
      previous.reason === stop.reason &&
      at <= previous.at + STOP_SLACK_SECONDS
    ) {
      // the same stop: measured from the soonest it was foreseen, so slack cannot pile up
      this._stop = { reason: stop.reason, at: Math.min(at, previous.at) };
      return why;
    }
    this._stop = { reason: stop.reason, at };
    return why ?? `stop: ${stop.reason} in ${stop.in_seconds} s`;
  }

  /**
   * Save if a status calls for it (`due`).
   *
   * @returns what the save did, or null when none was due.
   */
  async check(
    notes: readonly INote[],
    stop: IStop | null | undefined
  ): Promise<ISaveReport | null> {
    const why = this.due(notes, stop);
    return why === null ? null : this.save(why);
  }

  /**
   * Save every open document that is dirty and writable, after announcing it to the server.
   * Saves do not overlap: one asked for while another runs starts when that one is done (and
   * finds only what changed since).
   */
  save(why: string): Promise<ISaveReport> {
    const run = this._last.then(() => this._saveAll(why));
    this._last = run.then(
      () => undefined,
      () => undefined
    );
    return run;
  }

  private async _saveAll(why: string): Promise<ISaveReport> {
    const report: ISaveReport = { why, saved: [], failed: [] };
    const documents = this._documents().filter(d => d.dirty && d.writable);
    if (documents.length === 0) {
      return report;
    }
    try {
      await this._announce();
    } catch (error) {
      this._onError('announce the save', error);
    }
    const results = await Promise.allSettled(documents.map(d => d.save()));
    results.forEach((result, i) => {
      const path = documents[i].path;
      if (result.status === 'fulfilled') {
        report.saved.push(path);
      } else {
        report.failed.push(path);
        this._onError(`save ${path}`, result.reason);
      }
    });
    return report;
  }

  private _documents: () => IOpenDocument[];
  private _announce: () => Promise<void>;
  private _onError: (what: string, error: unknown) => void;
  private _now: () => number;
  private _seen = new Set<number>();
  private _stop: { reason: string; at: number } | null = null;
  private _last: Promise<void> = Promise.resolve();
}
