/**
 * Each notification shows once: JupyterLab shows an unread one, then marks it read on the
 * server (`POST /api/meterhub/notifications/read`), so a reload does not show it again. An idle
 * warning goes away by itself once the server is no longer near its idle action (any activity
 * cancels it). No browser needed: the classes take the functions that show, mark and dismiss
 * (src/__tests__).
 */
import { IIdle, INote, WARNING_KINDS, idleSecondsLeft } from './status';

/**
 * The most ids one mark-read request may carry (the server extension refuses more).
 */
export const MAX_IDS_PER_REQUEST = 100;

/**
 * How JupyterLab shows a notification of this kind: a warning for `WARNING_KINDS`, else
 * information.
 */
export function noteType(kind: string): 'warning' | 'info' {
  return WARNING_KINDS.has(kind) ? 'warning' : 'info';
}

/**
 * Whether a status says an idle warning no longer holds: the server has no idle timeout, or is
 * not within its warning time of the idle action any more (there was activity since). A server
 * older than idle shutdown says nothing (`undefined`), which cancels nothing.
 */
export function idleCancelled(idle: IIdle | null | undefined): boolean {
  return idle !== undefined && idleSecondsLeft(idle) === null;
}

/**
 * The idle warnings this page shows, dismissed together as soon as a status says they no longer
 * hold (`idleCancelled`).
 */
export class IdleWarnings {
  /**
   * @param dismiss - dismiss one shown notification (in JupyterLab: `Notification.dismiss`).
   */
  constructor(dismiss: (id: string) => void) {
    this._dismiss = dismiss;
  }

  /**
   * Remember a notification shown for an idle warning.
   */
  add(id: string): void {
    this._shown.add(id);
  }

  /**
   * "Keep running" on the warning `id`: tell the server (`post`, in JupyterLab
   * `POST api/meterhub/activity`, which counts as activity and so cancels the idle action), then
   * dismiss the warning. When the server did not hear it, the warning and its button stay, to
   * try again, and the error is passed on.
   */
  async keepRunning(id: string, post: () => Promise<void>): Promise<void> {
    await post();
    this._shown.delete(id);
    this._dismiss(id);
  }

  /**
   * Take in a new status: dismiss every idle warning shown when it says they no longer hold.
   *
   * @returns the ids dismissed.
   */
  update(idle: IIdle | null | undefined): string[] {
    if (!idleCancelled(idle)) {
      return [];
    }
    const ids = [...this._shown];
    this._shown.clear();
    ids.forEach(id => this._dismiss(id));
    return ids;
  }

  private _dismiss: (id: string) => void;
  private _shown = new Set<string>();
}

export namespace NotificationReader {
  export interface IOptions {
    /**
     * Show one notification (in JupyterLab: `Notification.warning`).
     */
    show: (note: INote) => void;
    /**
     * Mark these ids read on the server; rejects if the server did not.
     */
    markRead: (ids: number[]) => Promise<void>;
    /**
     * Told when marking failed; it is tried again with the next status.
     */
    onError?: (error: unknown) => void;
  }
}

export class NotificationReader {
  constructor(options: NotificationReader.IOptions) {
    this._show = options.show;
    this._markRead = options.markRead;
    this._onError = options.onError ?? (() => undefined);
  }

  /**
   * Show the unread notifications of a status answer that this page has not shown yet, then
   * mark all of them read. The ids stay remembered: a status fetched while marking was under
   * way, or after marking failed, still lists them, and they must not show twice.
   *
   * @returns how many ids the server was asked to mark.
   */
  async read(unread: readonly INote[]): Promise<number> {
    for (const note of unread) {
      if (!this._shown.has(note.id)) {
        this._shown.add(note.id);
        this._show(note);
      }
    }
    const ids = unread.map(note => note.id);
    let asked = 0;
    for (let i = 0; i < ids.length; i += MAX_IDS_PER_REQUEST) {
      const chunk = ids.slice(i, i + MAX_IDS_PER_REQUEST);
      try {
        await this._markRead(chunk);
        asked += chunk.length;
      } catch (error) {
        this._onError(error);
        break;
      }
    }
    return asked;
  }

  private _show: (note: INote) => void;
  private _markRead: (ids: number[]) => Promise<void>;
  private _onError: (error: unknown) => void;
  private _shown = new Set<number>();
}
