import { readFileSync } from 'fs';
import { join } from 'path';

import {
  IIdle,
  IStatus,
  idleSecondsLeft,
  level,
  statusLevel,
  statusText
} from '../status';

const STATUS: IStatus = {
  user: 'zed',
  balance: '9.87',
  currency: 'CNY',
  rate_per_hour: '0.10',
  minutes_left: 5922,
  warn_minutes: [30, 10, 2],
  profile: 'debug',
  gpus: 0,
  notifications: []
};

describe('statusText', () => {
  it('shows balance, rate and whole hours left', () => {
    expect(statusText(STATUS)).toBe('¥9.87 · ¥0.10/h · 98 h left');
  });

  it('shows minutes under an hour', () => {
    expect(statusText({ ...STATUS, minutes_left: 59 })).toBe(
      '¥9.87 · ¥0.10/h · 59 min left'
    );
  });

  it('says when nothing is charging', () => {
    expect(
      statusText({ ...STATUS, rate_per_hour: '0.00', minutes_left: null })
    ).toBe('¥9.87 · ¥0.00/h · not charging');
  });

  it('spells a currency it has no symbol for', () => {
    expect(statusText({ ...STATUS, currency: 'JPY' })).toBe(
      'JPY 9.87 · JPY 0.10/h · 98 h left'
    );
  });
});

describe('level', () => {
  it('warns at or below the largest threshold, critical at or below the second', () => {
    const thresholds = [30, 10, 2];
    expect(level(31, thresholds)).toBe('ok');
    expect(level(30, thresholds)).toBe('warning');
    expect(level(11, thresholds)).toBe('warning');
    expect(level(10, thresholds)).toBe('critical');
    expect(level(0, thresholds)).toBe('critical');
  });

  it('takes the thresholds in any order', () => {
    expect(level(45, [5, 60])).toBe('warning');
    expect(level(5, [5, 60])).toBe('critical');
    expect(level(61, [5, 60])).toBe('ok');
  });

  it('is critical at or below the only threshold', () => {
    expect(level(16, [15])).toBe('ok');
    expect(level(15, [15])).toBe('critical');
  });

  it('is ok when nothing is charging or the site has no thresholds', () => {
    expect(level(null, [30, 10])).toBe('ok');
    expect(level(1, [])).toBe('ok');
  });
});

function idle(idleSeconds: number, action: IIdle['action'] = 'stop'): IIdle {
  return {
    idle_seconds: idleSeconds,
    limit_seconds: 1800,
    warn_seconds: 300,
    action
  };
}

describe('idleSecondsLeft', () => {
  it('gives the seconds left only within the warning time', () => {
    expect(idleSecondsLeft(idle(1499))).toBeNull();
    expect(idleSecondsLeft(idle(1500))).toBe(300);
    expect(idleSecondsLeft(idle(1790))).toBe(10);
    // the meter acts on its next pass: never less than nothing
    expect(idleSecondsLeft(idle(1830))).toBe(0);
  });

  it('gives nothing without an idle timeout or from an older server', () => {
    expect(idleSecondsLeft(null)).toBeNull();
    expect(idleSecondsLeft(undefined)).toBeNull();
  });
});

describe('statusText before an idle action or a cap', () => {
  const base = '¥9.87 · ¥0.10/h · 98 h left';

  it('adds nothing while the idle action is farther than the warning time', () => {
    expect(statusText({ ...STATUS, idle: idle(60), stop: null })).toBe(base);
    expect(statusText({ ...STATUS, idle: null, stop: null })).toBe(base);
  });

  it('says when an idle server stops, or goes to debug mode, in whole minutes', () => {
    expect(statusText({ ...STATUS, idle: idle(1500) })).toBe(
      `${base} · idle: stops in 5 min`
    );
    expect(statusText({ ...STATUS, idle: idle(1559) })).toBe(
      `${base} · idle: stops in 4 min`
    );
    expect(statusText({ ...STATUS, idle: idle(1560, 'debug') })).toBe(
      `${base} · idle: debug mode in 4 min`
    );
    expect(statusText({ ...STATUS, idle: idle(1741) })).toBe(
      `${base} · idle: stops in under 1 min`
    );
  });

  it('says when the cap stops the server, but adds nothing for credit', () => {
    expect(
      statusText({ ...STATUS, stop: { reason: 'cap', in_seconds: 720 } })
    ).toBe(`${base} · cap: stops in 12 min`);
    expect(
      statusText({ ...STATUS, stop: { reason: 'cap', in_seconds: 3 * 3600 } })
    ).toBe(`${base} · cap: stops in 3 h`);
    expect(
      statusText({
        ...STATUS,
        minutes_left: 12,
        stop: { reason: 'credit', in_seconds: 720 }
      })
    ).toBe('¥9.87 · ¥0.10/h · 12 min left');
    // an idle stop is told by the idle part
    expect(
      statusText({
        ...STATUS,
        idle: idle(1560),
        stop: { reason: 'idle', in_seconds: 240 }
      })
    ).toBe(`${base} · idle: stops in 4 min`);
  });
});

describe('statusLevel', () => {
  it('is the credit level when nothing else is near', () => {
    expect(statusLevel(STATUS)).toBe('ok');
    expect(statusLevel({ ...STATUS, minutes_left: 20 })).toBe('warning');
    expect(statusLevel({ ...STATUS, minutes_left: 5, idle: idle(0) })).toBe(
      'critical'
    );
  });

  it('is at least a warning near the idle action, critical in its last minute', () => {
    expect(statusLevel({ ...STATUS, idle: idle(1499) })).toBe('ok');
    expect(statusLevel({ ...STATUS, idle: idle(1500) })).toBe('warning');
    expect(statusLevel({ ...STATUS, idle: idle(1739) })).toBe('warning');
    expect(statusLevel({ ...STATUS, idle: idle(1740) })).toBe('critical');
    expect(statusLevel({ ...STATUS, idle: idle(1740, 'debug') })).toBe(
      'critical'
    );
  });

  it("judges the cap's stop by the site's thresholds, as credit", () => {
    const cap = (minutes: number): IStatus => ({
      ...STATUS,
      stop: { reason: 'cap', in_seconds: minutes * 60 }
    });
    expect(statusLevel(cap(31))).toBe('ok');
    expect(statusLevel(cap(30))).toBe('warning');
    expect(statusLevel(cap(10))).toBe('critical');
  });
});

describe('statusText in Chinese', () => {
  // the catalog JupyterLab loads for zh-CN (tools/i18n.py compiles it from its .po)
  const catalog = JSON.parse(
    readFileSync(
      join(__dirname, '../../../locale/zh_CN/LC_MESSAGES/meterhub.json'),
      'utf-8'
    )
  ) as Record<string, string[]>;
  const chinese = {
    __: (msgid: string, ...args: unknown[]) =>
      (catalog[msgid]?.[0] ?? msgid).replace(/%(\d+)/g, (_m, n) =>
        String(args[Number(n) - 1])
      )
  };

  it('reads naturally, the same numbers as in English', () => {
    expect(statusText(STATUS, chinese)).toBe(
      '¥9.87 · ¥0.10/小时 · 还可用 98 小时'
    );
    expect(
      statusText(
        {
          ...STATUS,
          idle: {
            idle_seconds: 1500,
            limit_seconds: 1800,
            warn_seconds: 300,
            action: 'stop'
          },
          stop: { reason: 'cap', in_seconds: 720 }
        },
        chinese
      )
    ).toBe(
      '¥9.87 · ¥0.10/小时 · 还可用 98 小时 · 空闲：5 分钟后停止 · 上限：12 分钟后停止'
    );
  });

  it('has every string the status bar says', () => {
    for (const msgid of [
      'not charging',
      '%1 min left',
      'in under 1 min',
      'idle: debug mode %1'
    ]) {
      expect(catalog[msgid]?.[0]).toBeTruthy();
    }
  });
});
