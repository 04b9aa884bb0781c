/**
 * Each notification shows once: JupyterLab shows an unread one, then marks it read on the
 * server (`POST /api/meterhub/notifications/read`), so a reload does not show it again.
 * No browser needed: the class takes the functions that show and mark (src/__tests__).
 */
import { INote } from './status';

/**
 * The most ids one mark-read request may carry (the server extension refuses more).
 */
export const MAX_IDS_PER_REQUEST = 100;

/**
 * How JupyterLab shows a notification of this kind: the meter's warnings, stops and ended
 * passes are warnings; anything newer is information.
 */
export function noteType(kind: string): 'warning' | 'info' {
  return ['warning', 'stopped', 'pass-ended'].includes(kind)
    ? 'warning'
    : 'info';
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
