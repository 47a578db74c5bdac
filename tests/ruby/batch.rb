# Makes a capstan batch from Ruby with examples/ruby/capstan_batch.rb, as a Ruby app
# would, for tests/test_batch.c.
#
#   ruby batch.rb create N   N RecordJob ["rrec"] jobs, success callback
#                            BatchCallbackJob on queue "callbacks" with
#                            options {"key": "rubycb"}; prints the bid
#   ruby batch.rb nested N   for Sidekiq alone, on queue "callbacks": a
#                            parent with one RubyRecordJob ["rnrec"] and a
#                            child of N of them, each batch with a success
#                            callback {"key": "rubynest"}; prints the
#                            parent's bid
#   ruby batch.rb dies       one RubyDyingJob, complete and death callbacks
#                            {"key": "rubydie"} on "callbacks"; prints the bid
#   ruby batch.rb drops      the same with retry: false (Sidekiq drops it)
#                            and the key "rubydrop"
require 'sidekiq'
require_relative '../../examples/ruby/capstan_batch'

Redis.sadd_returns_boolean = false if defined?(Redis) && Redis.respond_to?(:sadd_returns_boolean=)
Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch('REDIS_URL') } }
Sidekiq.logger.level = Logger::WARN

mode = ARGV.shift
case mode
when 'create'
  batch = Capstan::Batch.new(description: 'from Ruby')
  batch.on(:success, 'BatchCallbackJob', queue: 'callbacks', options: { 'key' => 'rubycb' })
  begin
    batch.on(:success, 'Bad', options: [1])
    abort('a malformed callback was taken')
  rescue ArgumentError
  end
  batch.jobs do
    Integer(ARGV[0]).times { Sidekiq::Client.push('class' => 'RecordJob', 'args' => ['rrec']) }
  end
  puts batch.bid
when 'nested'
  push = -> { Sidekiq::Client.push('class' => 'RubyRecordJob', 'queue' => 'callbacks', 'args' => ['rnrec']) }
  parent = Capstan::Batch.new(description: 'parent')
  parent.on(:success, 'BatchCallbackJob', queue: 'callbacks', options: { 'key' => 'rubynest' })
  parent.jobs do
    child = Capstan::Batch.new(description: 'child', parent_bid: parent.bid)
    child.on(:success, 'BatchCallbackJob', queue: 'callbacks', options: { 'key' => 'rubynest' })
    child.jobs { Integer(ARGV[0]).times { push.call } }
    push.call
  end
  puts parent.bid
when 'dies', 'drops'
  key = mode == 'dies' ? 'rubydie' : 'rubydrop'
  batch = Capstan::Batch.new(description: mode)
  %i[complete death].each do |event|
    batch.on(event, 'BatchCallbackJob', queue: 'callbacks', options: { 'key' => key })
  end
  # The class is Sidekiq's to load: its retry option goes in the push.
  retry_opt = mode == 'dies' ? 0 : false
  batch.jobs do
    Sidekiq::Client.push('class' => 'RubyDyingJob', 'queue' => 'callbacks', 'args' => [],
                         'retry' => retry_opt)
  end
  puts batch.bid
else
  abort('usage: batch.rb create N | nested N | dies | drops')
end
