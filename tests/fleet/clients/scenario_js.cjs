// The client matrix's scenario for the JS SDK (npm `e2b`), run with the machine's Node.js
// and NODE_PATH at the client cache, configured by the environment alone (E2B_API_KEY,
// E2B_API_URL, E2B_SANDBOX_URL). Prints one JSON object of what it saw; the test asserts
// on it. Also checks that envd's stream errors reach the SDK as its typed errors.
const e2b = require('e2b')
const { Sandbox } = e2b

async function until(read, ok, seconds = 20) {
  const deadline = Date.now() + seconds * 1000
  for (;;) {
    const value = await read()
    if (ok(value) || Date.now() > deadline) return value
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
}

async function api(path) {
  const reply = await fetch(process.env.E2B_API_URL + path, {
    headers: { 'X-API-Key': process.env.E2B_API_KEY },
  })
  return reply.json()
}

async function errorName(promise) {
  try {
    await promise
    return 'no error'
  } catch (error) {
    return error.constructor.name
  }
}

async function main() {
  const tag = process.argv[2]
  const seen = { version: require('e2b/package.json').version }
  const sandbox = await Sandbox.create({ metadata: { matrix: tag } })
  try {
    seen.run = (await sandbox.commands.run('echo hi from $0')).stdout
    await sandbox.files.write('/home/user/notes/a.txt', 'written')
    seen.files = await sandbox.files.read('/home/user/notes/a.txt')
    const events = []
    const watcher = await sandbox.files.watchDir('/home/user/notes', (event) => events.push(event))
    await sandbox.files.write('/home/user/notes/b.txt', 'b')
    await until(() => events, (found) => found.length > 0)
    await watcher.stop()
    seen.watch = [...new Set(events.map((event) => `${event.name}:${event.type}`))].sort()
    let output = ''
    const terminal = await sandbox.pty.create({
      cols: 80,
      rows: 24,
      onData: (data) => {
        output += new TextDecoder().decode(data)
      },
    })
    await sandbox.pty.sendInput(terminal.pid, new TextEncoder().encode('echo pty-$((6*7))\nexit\n'))
    await terminal.wait()
    seen.pty = output.includes('pty-42')
    // envd's stream errors, as the protocol puts them: HTTP 200 and the end of the stream
    seen.errors = {
      watchMissing: await errorName(sandbox.files.watchDir('/home/user/none', () => {})),
      runAsRoot: await errorName(sandbox.commands.run('id', { user: 'root' })),
      connectUnknown: await errorName(sandbox.commands.connect(999999)),
    }
    const listed = await Sandbox.list({ query: { metadata: { matrix: tag } } }).nextItems()
    seen.list = listed.map((info) => [info.sandboxId === sandbox.sandboxId, info.metadata])
    const metrics = await until(() => sandbox.getMetrics(), (found) => found.length > 0)
    const newest = metrics[metrics.length - 1]
    seen.metrics = { cpu_count: newest.cpuCount, mem_total: newest.memTotal }
    const logs = await api(`/v2/sandboxes/${sandbox.sandboxId}/logs`)
    seen.logs = logs.logs.map((entry) => entry.message).slice(0, 2)
    seen.templates = (await api('/templates')).map((template) => template.templateID).sort()
  } finally {
    seen.kill = await sandbox.kill()
  }
  seen.running_after_kill = await Sandbox.list({ query: { metadata: { matrix: tag } } }).nextItems()
  console.log(JSON.stringify(seen))
}

main().catch((error) => {
  console.error(error)
  process.exit(1)
})
