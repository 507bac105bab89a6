/** Waiting without spinning, and the µs the histograms record. */

export const sleep = (ms: number) => new Promise<void>((res) => setTimeout(res, ms));
export const yieldNow = () => new Promise<void>((res) => setImmediate(res));
export const cpuMs = (u: NodeJS.CpuUsage) => (u.user + u.system) / 1000;

/** A duration in ms as the µs a histogram records: at least 1, its lowest discernible value. */
export const toUs = (ms: number) => Math.max(1, Math.round(ms * 1000));
