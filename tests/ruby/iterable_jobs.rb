# Ruby side of the iterable job tests (tests/test_iterable.c), run by a real
# Sidekiq 7.3, 8.0 or 8.1 server: IterateJob as a Sidekiq::IterableJob walking
# the same steps with the same cursor as capstan's IterateJob
# (examples/jobs.c), so either resumes where the other stopped.
require_relative 'sidekiq_setup'
require 'sidekiq/iterable_job'

class IterateJob
  include Sidekiq::IterableJob

  # [key, n, step, ms]: steps 0 .. n/step - 1; the cursor is the step's index.
  def build_enumerator(_key, n, step = 100, _ms = 0, cursor:)
    array_enumerator((0...((n + step - 1) / step)).to_a, cursor: cursor)
  end

  def each_iteration(k, key, _n, step = 100, ms = 0)
    Sidekiq.redis { |c| c.call('RPUSH', "#{key}:steps", (k * step).to_s) }
    sleep(ms / 1000.0) if ms.positive?
  end

  def on_complete
    Sidekiq.redis { |c| c.call('RPUSH', "#{arguments[0]}:done", "#{jid}-#{@_executions}") }
  end
end
