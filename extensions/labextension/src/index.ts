/**
 * meterhub in JupyterLab: "¥9.87 · ¥0.10/h · 98 h left" in the status bar, polled from the
 * server's /api/meterhub/status, styled by how near the stop is (`data-level`, style/index.css),
 * and a JupyterLab notification for each new warning ("10 minutes of credit left — your server
 * will stop; your files are kept"), shown once and then marked read.
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { NotificationReader, noteType } from './notes';
import { INote, IStatus, level, statusText } from './status';

export { level, statusText } from './status';

/**
 * How often the status is asked for: the meter moves credit once a minute by default.
 */
const INTERVAL_MS = 15 * 1000;
/**
 * The longest wait between tries while the server fails (each failure doubles the wait).
 */
const MAX_INTERVAL_MS = 5 * 60 * 1000;

function showNote(note: INote): void {
  // stays until dismissed: a warning about a stop must not slip by
  if (noteType(note.kind) === 'warning') {
    Notification.warning(note.message, { autoClose: false });
  } else {
    Notification.info(note.message, { autoClose: false });
  }
}

/**
 * The status bar item: the credit, refreshed by a poll that backs off while the server fails
 * and sleeps while the tab is hidden.
 */
class CreditStatus extends Widget {
  constructor(settings: ServerConnection.ISettings) {
    super();
    this._settings = settings;
    this.id = 'meterhub-credit-status';
    this.addClass('jp-StatusBar-TextItem');
    this.addClass('meterhub-credit-status');
    this.node.title = 'meterhub: your credit';
    this.node.textContent = 'credit …';
    this._reader = new NotificationReader({
      show: showNote,
      markRead: ids => this._markRead(ids),
      onError: error =>
        console.warn('meterhub: could not mark notifications read', error)
    });
    this._poll = new Poll({
      factory: () => this.refresh(),
      frequency: { interval: INTERVAL_MS, backoff: true, max: MAX_INTERVAL_MS },
      name: '@meterhub/credit-status:CreditStatus#status',
      standby: 'when-hidden'
    });
  }

  /**
   * Ask for the status once and show it. Rejects when the server fails, so the poll backs off.
   */
  async refresh(): Promise<void> {
    let status: IStatus;
    try {
      const response = await ServerConnection.makeRequest(
        this._url('api/meterhub/status'),
        {},
        this._settings
      );
      if (!response.ok) {
        throw await ServerConnection.ResponseError.create(response);
      }
      status = (await response.json()) as IStatus;
    } catch (error) {
      this.node.textContent = 'credit unavailable';
      delete this.node.dataset.level;
      throw error;
    }
    this.node.textContent = statusText(status);
    this.node.dataset.level = level(
      status.minutes_left,
      status.warn_minutes ?? []
    );
    await this._reader.read(status.notifications);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    super.dispose();
  }

  private async _markRead(ids: number[]): Promise<void> {
    const response = await ServerConnection.makeRequest(
      this._url('api/meterhub/notifications/read'),
      { method: 'POST', body: JSON.stringify({ ids }) },
      this._settings
    );
    if (!response.ok) {
      throw await ServerConnection.ResponseError.create(response);
    }
  }

  private _url(path: string): string {
    return URLExt.join(this._settings.baseUrl, path);
  }

  private _settings: ServerConnection.ISettings;
  private _reader: NotificationReader;
  private _poll: Poll;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: '@meterhub/credit-status:plugin',
  description: 'Credit left in the status bar, and warnings before a stop.',
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    const item = new CreditStatus(app.serviceManager.serverSettings);
    if (statusBar) {
      statusBar.registerStatusItem(plugin.id, {
        item,
        align: 'left',
        rank: 0
      });
    }
  }
};

export default plugin;
