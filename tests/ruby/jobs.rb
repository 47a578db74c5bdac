# Ruby job classes for the interop tests that run a real Sidekiq server
# (6.4.1, 7.3 or 8.0: `sidekiq -r tests/ruby/jobs.rb`) on jobs pushed by
# capstan's client. RecordJob leaves the same trace as the C example
# handler, so a test reads one format whichever side ran the job.
require 'json'
require_relative 'sidekiq_setup'

# RecordJob key [more...]: SADD key jid and RPUSH key:log jid, as the C
# handler does; any further arguments are appended to key:args as the JSON
# Ruby generates for them, to show what values reached Ruby.
class RecordJob
  include Sidekiq::Worker

  def perform(key, *rest)
    Sidekiq.redis do |c|
      c.sadd(key, jid)
      c.rpush("#{key}:log", jid)
      c.rpush("#{key}:args", JSON.generate(rest)) unless rest.empty?
    end
  end
end
