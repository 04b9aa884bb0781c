import {
  IdleWarnings,
  MAX_IDS_PER_REQUEST,
  NotificationReader,
  idleCancelled,
  noteType
} from '../notes';
import { IIdle, INote, WARNING_KINDS } from '../status';

function note(id: number, kind = 'warning'): INote {
  return { id, kind, message: `note ${id}` };
}

/**
 * A server that remembers what was marked read, and can be made to fail.
 */
class FakeServer {
  read = new Set<number>();
  requests: number[][] = [];
  failing = false;

  async markRead(ids: number[]): Promise<void> {
    this.requests.push(ids);
    if (this.failing) {
      throw new Error('502: the billing service answered 503');
    }
    ids.forEach(id => this.read.add(id));
  }

  unread(notes: INote[]): INote[] {
    return notes.filter(n => !this.read.has(n.id));
  }
}

function reader(server: FakeServer, shown: INote[], errors: unknown[] = []) {
  return new NotificationReader({
    show: n => shown.push(n),
    markRead: ids => server.markRead(ids),
    onError: e => errors.push(e)
  });
}

describe('NotificationReader', () => {
  it('shows each unread notification once and marks it read', async () => {
    const server = new FakeServer();
    const shown: INote[] = [];
    const page = reader(server, shown);
    const notes = [note(1), note(2, 'stopped')];
    expect(await page.read(server.unread(notes))).toBe(2);
    expect(shown.map(n => n.id)).toEqual([1, 2]);
    expect(server.requests).toEqual([[1, 2]]);
    expect(server.unread(notes)).toEqual([]);
    // the next status has nothing unread: nothing more is shown or sent
    expect(await page.read(server.unread(notes))).toBe(0);
    expect(shown).toHaveLength(2);
    expect(server.requests).toHaveLength(1);
  });

  it('does not show again after a reload: a new page gets only what is unread', async () => {
    const server = new FakeServer();
    const first: INote[] = [];
    await reader(server, first).read(server.unread([note(1)]));
    const afterReload: INote[] = [];
    const notes = [note(1), note(2)];
    await reader(server, afterReload).read(server.unread(notes));
    expect(first.map(n => n.id)).toEqual([1]);
    expect(afterReload.map(n => n.id)).toEqual([2]);
  });

  it('retries marking that failed without showing the notification twice', async () => {
    const server = new FakeServer();
    const shown: INote[] = [];
    const errors: unknown[] = [];
    const page = reader(server, shown, errors);
    server.failing = true;
    expect(await page.read(server.unread([note(7)]))).toBe(0);
    expect(errors).toHaveLength(1);
    expect(server.read.size).toBe(0);
    server.failing = false;
    // still unread on the server, so the next status lists it again
    expect(await page.read(server.unread([note(7)]))).toBe(1);
    expect(shown.map(n => n.id)).toEqual([7]);
    expect([...server.read]).toEqual([7]);
  });

  it('marks many in requests of at most the server limit', async () => {
    const server = new FakeServer();
    const notes = Array.from({ length: MAX_IDS_PER_REQUEST + 5 }, (_, i) =>
      note(i + 1)
    );
    const shown: INote[] = [];
    expect(await reader(server, shown).read(notes)).toBe(notes.length);
    expect(server.requests.map(r => r.length)).toEqual([
      MAX_IDS_PER_REQUEST,
      5
    ]);
    expect(shown).toHaveLength(notes.length);
  });
});

describe('noteType', () => {
  it("shows the meter's warnings, stops and ended passes as warnings", () => {
    expect(noteType('warning')).toBe('warning');
    expect(noteType('stopped')).toBe('warning');
    expect(noteType('pass-ended')).toBe('warning');
    expect(noteType('idle-warning')).toBe('warning');
    expect(noteType('cap-warning')).toBe('warning');
    expect(noteType('restarted')).toBe('info');
    expect(noteType('news')).toBe('info');
    expect(noteType('toString')).toBe('info');
  });

  it('gives only an idle warning "Keep running"', () => {
    const keepRunning = [...WARNING_KINDS].filter(([, k]) => k.keepRunning);
    expect(keepRunning.map(([kind]) => kind)).toEqual(['idle-warning']);
  });
});

function idle(idleSeconds: number): IIdle {
  return {
    idle_seconds: idleSeconds,
    limit_seconds: 1800,
    warn_seconds: 300,
    action: 'stop'
  };
}

describe('IdleWarnings', () => {
  it('keeps the idle warnings while the idle action is near', () => {
    const dismissed: string[] = [];
    const warnings = new IdleWarnings(id => dismissed.push(id));
    warnings.add('n1');
    expect(warnings.update(idle(1500))).toEqual([]);
    expect(warnings.update(idle(1790))).toEqual([]);
    expect(dismissed).toEqual([]);
  });

  it('dismisses all it showed once activity moved the idle action away', () => {
    const dismissed: string[] = [];
    const warnings = new IdleWarnings(id => dismissed.push(id));
    warnings.add('n1');
    warnings.add('n2');
    expect(warnings.update(idle(12))).toEqual(['n1', 'n2']);
    expect(dismissed).toEqual(['n1', 'n2']);
    // dismissed once
    expect(warnings.update(idle(13))).toEqual([]);
    expect(dismissed).toEqual(['n1', 'n2']);
  });

  it('dismisses when the server has no idle timeout any more', () => {
    const dismissed: string[] = [];
    const warnings = new IdleWarnings(id => dismissed.push(id));
    warnings.add('n1');
    expect(warnings.update(null)).toEqual(['n1']);
  });

  it('"Keep running" tells the server, then dismisses its warning', async () => {
    const log: string[] = [];
    const warnings = new IdleWarnings(id => log.push(`dismiss ${id}`));
    warnings.add('n1');
    warnings.add('n2');
    await warnings.keepRunning('n1', async () => {
      log.push('POST activity');
    });
    expect(log).toEqual(['POST activity', 'dismiss n1']);
    // the next status: the activity cancelled the idle action; n1 is not dismissed twice
    expect(warnings.update(idle(3))).toEqual(['n2']);
  });

  it('"Keep running" leaves the warning when the server did not hear it', async () => {
    const dismissed: string[] = [];
    const warnings = new IdleWarnings(id => dismissed.push(id));
    warnings.add('n1');
    await expect(
      warnings.keepRunning('n1', async () => {
        throw new Error('502: the server did not answer');
      })
    ).rejects.toThrow('502');
    expect(dismissed).toEqual([]);
    // still near the idle action: it stays; once cancelled, it goes
    expect(warnings.update(idle(1600))).toEqual([]);
    expect(warnings.update(idle(0))).toEqual(['n1']);
  });

  it('dismisses nothing on a status from a server older than idle shutdown', () => {
    const dismissed: string[] = [];
    const warnings = new IdleWarnings(id => dismissed.push(id));
    warnings.add('n1');
    expect(warnings.update(undefined)).toEqual([]);
    expect(dismissed).toEqual([]);
  });
});

describe('idleCancelled', () => {
  it('holds when the status says the idle action is not near', () => {
    expect(idleCancelled(idle(0))).toBe(true);
    expect(idleCancelled(null)).toBe(true);
    expect(idleCancelled(idle(1500))).toBe(false);
    expect(idleCancelled(undefined)).toBe(false);
  });
});
